"""The ledger's pure parts: a check's book of pages (what is listed, what is counted, one
page per tenant, the hour's bounds, the cap), a page's item round trip, the merge of the
upcoming fires against a brute force, and the next_token's binding to its query."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from punctual.control.ledger import _decode, _encode, _fires, _Position
from punctual.dal.ledger import ledger_pk, ledger_sk, page_from_item, page_to_item
from punctual.domain.errors import InvalidInput
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.domain.ledger import LISTED_PER_PAGE, LedgerBook, LedgerEntry, listed
from punctual.domain.occurrence import OccurrenceState
from punctual.domain.schedule import Schedule
from tests.instants import epoch

HOUR_START = epoch("2026-12-07T10:00:00Z")


def entry(
    n: int, at: int, finding: Finding, attempts: int = 1, state: OccurrenceState | None = None
) -> LedgerEntry:
    sid = f"sch_alice.s{n}"
    return LedgerEntry(
        occurrence_id=occurrence_id(sid, 1, at),
        schedule_id=sid,
        scheduled_for=at,
        finding=finding,
        state=state,
        attempts=attempts,
        target="default",
    )


def test_only_a_success_at_the_first_attempt_is_not_listed():
    assert not listed(Finding.SUCCEEDED, 1)
    assert not listed(Finding.SUCCEEDED, 0)
    assert listed(Finding.SUCCEEDED, 2)
    assert all(listed(f, 1) for f in Finding if f is not Finding.SUCCEEDED)


def test_a_book_makes_one_page_per_tenant_with_its_counts_and_its_exceptions_in_order():
    book = LedgerBook(HOUR_START, shard=3)
    book.add("alice", entry(1, HOUR_START + 600, Finding.DEAD, 3, OccurrenceState.DEAD))
    book.add("alice", entry(2, HOUR_START + 60, Finding.SUCCEEDED))
    book.add("alice", entry(3, HOUR_START + 30, Finding.SUCCEEDED, 2))
    book.add("bob", entry(4, HOUR_START, Finding.MISSING))
    book.unreadable("bob", 2)
    book.unreadable("alice", 0)
    # (one outside the hour: another page's, a backfill's of another hour)
    book.add("alice", entry(5, HOUR_START + 3600, Finding.DEAD))
    book.add("alice", entry(6, HOUR_START - 1, Finding.DEAD))
    alice, bob = book.pages(checked_at=HOUR_START + 7500)
    assert (alice.tenant_id, alice.hour, alice.shard, alice.checked_at) == (
        "alice",
        HOUR_START,
        3,
        HOUR_START + 7500,
    )
    assert alice.counts == {Finding.DEAD: 1, Finding.SUCCEEDED: 2}
    assert [e.scheduled_for - HOUR_START for e in alice.entries] == [30, 600]
    assert (alice.retried, alice.unreadable, alice.unlisted) == (2, 0, 0)
    assert bob.counts == {Finding.MISSING: 1}
    assert (bob.unreadable, len(bob.entries)) == (2, 1)


def test_a_page_lists_at_most_its_cap_the_earliest_and_counts_the_rest():
    book = LedgerBook(HOUR_START, shard=0)
    added = [entry(n, HOUR_START + (n * 7919) % 3600, Finding.DEAD, 2) for n in range(1007)]
    for one in added:
        book.add("alice", one)
    [page] = book.pages(checked_at=HOUR_START + 7200)
    assert page.entries == sorted(added, key=lambda e: e.order)[:LISTED_PER_PAGE]
    assert page.unlisted == 1007 - LISTED_PER_PAGE
    assert page.retried == 1007
    assert page.counts == {Finding.DEAD: 1007}


def test_a_book_covers_an_aligned_hour_only():
    with pytest.raises(ValueError, match="aligned hour"):
        LedgerBook(HOUR_START + 60, shard=0)


def test_a_page_survives_its_item_whole():
    book = LedgerBook(HOUR_START, shard=12)
    book.add("alice", entry(1, HOUR_START + 5, Finding.MISSING, 0, OccurrenceState.SCHEDULED))
    book.add("alice", entry(2, HOUR_START + 9, Finding.MISSED))
    book.add("alice", entry(3, HOUR_START + 9, Finding.SUCCEEDED))
    [page] = book.pages(checked_at=HOUR_START + 7300)
    item = page_to_item(page, purge_at=HOUR_START + 86400)
    assert (item["pk"], item["sk"]) == ("alice#20261207", f"{HOUR_START:012d}#00012")
    assert json.loads(item["entries"])[0][:3] == [
        HOUR_START + 5,
        page.entries[0].occurrence_id,
        "MISSING",
    ]
    assert page_from_item(item) == page
    assert ledger_pk("alice", HOUR_START + 86399 - 36000) == "alice#20261207"
    assert ledger_sk(HOUR_START, 5) < ledger_sk(HOUR_START, 12) < ledger_sk(HOUR_START + 3600, 0)


def _schedule(n: int, spec: dict[str, object], created: str = "2026-12-01T00:00:00Z") -> Schedule:
    return Schedule.model_validate(
        {
            "schedule_id": f"sch_alice.s{n}",
            "tenant_id": "alice",
            "spec": spec,
            "target": "default",
            "version": 1,
            "state": "ACTIVE",
            "created_at": created,
            "updated_at": created,
        }
    )


SPECS: list[dict[str, object]] = [
    {"kind": "cron", "expression": "*/7 * * * *", "timezone": "UTC"},
    {"kind": "cron", "expression": "30 2 * * *", "timezone": "America/New_York"},
    {"kind": "rate", "expression": "rate(13 minutes)"},
    {"kind": "cron", "expression": "0 * * * *", "timezone": "Asia/Kolkata"},
    {"kind": "at", "at": "2026-12-07T10:17:00Z"},
]


@settings(max_examples=60, deadline=None)
@given(
    chosen=st.lists(st.sampled_from(range(len(SPECS))), min_size=1, max_size=6),
    low=st.integers(0, 3 * 86400),
    span=st.integers(1, 86400),
    cut=st.integers(0, 40),
)
def test_upcoming_fires_are_every_schedules_fires_in_order_and_a_resumed_read_goes_on(
    chosen: list[int], low: int, span: int, cut: int
):
    # GIVEN schedules (the same spec twice now and then: ties at one instant)
    schedules = [_schedule(n, SPECS[k]) for n, k in enumerate(chosen)]
    start = epoch("2026-12-06T00:00:00Z") + low
    until = start + span
    # THEN the merge is every fire in [start, until), by instant then id (a brute force)
    expected = sorted(
        (fire, occurrence_id(s.schedule_id, s.run_version, fire))
        for s in schedules
        for fire in s.rule().fires(start - 1, until - 1)
    )
    merged = [(f.scheduled_for, f.occurrence_id) for f in _fires(schedules, start, until, None)]
    assert merged == expected
    # AND a read resumed after any item gives exactly the rest
    if cut < len(expected):
        after = expected[cut]
        rest = [(f.scheduled_for, f.occurrence_id) for f in _fires(schedules, start, until, after)]
        assert rest == expected[cut + 1 :]


def test_a_token_names_its_position_and_the_query_it_was_made_for():
    query = (100, 200, "abc")
    token = _encode(query, _Position(0, 3600, (120, "occ_x")))
    assert _decode(token) == (_Position(0, 3600, (120, "occ_x")), query)
    upcoming = _encode(query, _Position(1, None, (150, "occ_y")))
    assert _decode(upcoming) == (_Position(1, None, (150, "occ_y")), query)
    assert _decode(None) == (_Position(), None)


@pytest.mark.parametrize(
    "raw",
    [
        "not base64 ~~",
        base64.urlsafe_b64encode(b"[1,2]").decode(),
        base64.urlsafe_b64encode(json.dumps([1, 2, "d", 2, None, [1, "x"]]).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps([1, 2, "d", 0, None, [1, "x"]]).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps([1, 2, "d", 1, 3600, [1, "x"]]).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps([1, 2, "d", 0, 3600, None]).encode()).decode(),
    ],
)
def test_a_token_not_made_here_is_refused_naming_next_token(raw: str):
    with pytest.raises(InvalidInput) as refused:
        _decode(raw)
    assert refused.value.details["fields"][0]["field"] == "next_token"

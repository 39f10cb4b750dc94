"""The ledger's pure parts: a check's book of pages (what is listed, what is counted, one
page per tenant, the hour's bounds, the cap), a page's item round trip, the merge of the
upcoming fires against a brute force, and the next_token's binding to its query."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import punctual.dal.ledger as dal_ledger
from punctual.control.ledger import (
    MARKS_DAYS,
    MARKS_SECONDS,
    Marks,
    _decode,
    _encode,
    _fires,
    _Position,
)
from punctual.dal.ledger import ROWS_BYTES, ledger_pk, ledger_sk, page_from_item, page_to_item
from punctual.domain.errors import InvalidInput
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.domain.ledger import LISTED_PER_PAGE, LedgerBook, LedgerEntry, listed
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.domain.schedule import Schedule
from punctual.services import Services
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
    token = _encode(query, _Position(0, 3600, (3720, "occ_x")))
    assert _decode(token) == (_Position(0, 3600, (3720, "occ_x")), query)
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
        # (an hour not on the hour, a last item outside its hour, a number past a float's)
        base64.urlsafe_b64encode(json.dumps([1, 2, "d", 0, 3601, [3700, "x"]]).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps([1, 2, "d", 0, 3600, [7200, "x"]]).encode()).decode(),
        base64.urlsafe_b64encode(b'[1, 2, "d", 0, 1e400, [3700, "x"]]').decode(),
    ],
)
def test_a_token_not_made_here_is_refused_naming_next_token(raw: str):
    with pytest.raises(InvalidInput) as refused:
        _decode(raw)
    assert refused.value.message == "next_token is not valid"
    assert refused.value.details["fields"] == [
        {
            "field": "next_token",
            "reason": "not a token issued for this query (from, to, filters)",
        }
    ]


class _Store:
    def __init__(self) -> None:
        self.reads: list[int] = []

    def checked(self, first: int, last: int) -> dict[int, dict[int, int]]:
        self.reads.append(first)
        return {first: {0: len(self.reads)}}


def test_a_days_marks_are_read_again_after_a_minute_and_a_few_days_are_kept():
    store = _Store()
    services = cast(
        Services, SimpleNamespace(ledger=store, settings=SimpleNamespace(ledger_table="t"))
    )
    marks = Marks()
    day = HOUR_START - HOUR_START % 86400
    # (kept for MARKS_SECONDS: read once, then again)
    assert marks.of_day(services, day, 1000) == {day: {0: 1}}
    assert marks.of_day(services, day, 1000 + MARKS_SECONDS - 1) == {day: {0: 1}}
    assert marks.of_day(services, day, 1000 + MARKS_SECONDS) == {day: {0: 2}}
    assert store.reads == [day, day]
    # (a clock that went back reads again too)
    marks.of_day(services, day, 999)
    assert len(store.reads) == 3
    # (at most MARKS_DAYS days, the one read longest ago dropped first)
    for k in range(1, MARKS_DAYS + 1):
        marks.of_day(services, day + k * 86400, 2000 + k)
    reads = len(store.reads)
    marks.of_day(services, day + MARKS_DAYS * 86400, 2000 + MARKS_DAYS)  # (kept)
    assert len(store.reads) == reads
    marks.of_day(services, day, 2000)  # (dropped: read again)
    assert len(store.reads) == reads + 1


def test_an_entry_takes_its_instant_from_the_id_and_no_target_that_is_no_name():
    # GIVEN an occurrence item a tenant's worker rewrote: another instant, a target of no
    # target's name; made late (the catch-up lane)
    at = HOUR_START + 600
    written = Occurrence(
        occurrence_id=occurrence_id("sch_alice.s1", 1, at),
        tenant_id="alice",
        schedule_id="sch_bob.s9",
        schedule_version=1,
        scheduled_for=at + 7 * 86400,
        available_at=at,
        target="漢" * 100,
        state=OccurrenceState.DEAD,
        attempt_count=2,
        lane=Lane.CATCHUP,
    )
    entry = LedgerEntry.of(written, Finding.DEAD)
    # THEN the entry is the id's: its schedule and instant; no target; late
    assert (entry.schedule_id, entry.scheduled_for) == ("sch_alice.s1", at)
    assert entry.target is None
    assert entry.late
    assert entry.available_at is None  # (only with detail)
    assert LedgerEntry.of(written, Finding.DEAD, detail=True).available_at == at
    assert (
        LedgerEntry.of(written.model_copy(update={"target": "billing-2"}), Finding.DEAD).target
        == "billing-2"
    )
    # AND a late success is listed, a success in time is not
    assert listed(Finding.SUCCEEDED, 1, late=True)
    assert not listed(Finding.SUCCEEDED, 1, late=False)


def test_a_pages_rows_stay_within_their_bytes_the_rest_counted():
    book = LedgerBook(HOUR_START, shard=0)
    for n in range(LISTED_PER_PAGE):
        book.add("alice", entry(n, HOUR_START + n, Finding.DEAD, 2))
    [page] = book.pages(checked_at=HOUR_START + 7200)
    item = page_to_item(page, purge_at=0)
    assert item["unlisted"] == 0
    # (rows of the longest ids a schedule has: a few hundred bytes each, far below the cap)
    assert len(item["entries"].encode()) < ROWS_BYTES
    # WHEN the cap is lower than the rows THEN the rows are cut there and the rest counted
    original = dal_ledger.ROWS_BYTES
    try:
        dal_ledger.ROWS_BYTES = 1000
        cut = page_to_item(page, purge_at=0)
    finally:
        dal_ledger.ROWS_BYTES = original
    kept = json.loads(cut["entries"])
    assert len(cut["entries"].encode()) <= 1000
    assert cut["unlisted"] == LISTED_PER_PAGE - len(kept) > 0
    assert page_from_item(cut).entries == page.entries[: len(kept)]
    # AND the digest says what the page says, not when it was checked
    later = page.model_copy(update={"checked_at": page.checked_at + 3600})
    assert page_to_item(later, 5)["digest"] == item["digest"]
    changed = page.model_copy(update={"retried": 0})
    assert page_to_item(changed, 0)["digest"] != item["digest"]

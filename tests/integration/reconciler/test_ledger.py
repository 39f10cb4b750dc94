"""The tenant-wide ledger (GET /v1/occurrences): the reconciler's check of an hour writes each
tenant's page (counts by finding, the exceptions listed), and the API lists them across
schedules and shards in time order, then the upcoming fires of the active schedules; one
tenant never sees another's; an incomplete or failed check writes nothing and the hour is
checked again; a slow older check never puts back older states; bad input is a 400 naming
the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from punctual.control.ledger import (
    Ledger,
    LedgerAnswer,
    LedgerFilter,
    Upcoming,
    _decode,
    _encode,
    _Position,
)
from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.ledger import ledger_pk, ledger_sk
from punctual.dal.tables import occurrence_key
from punctual.domain.errors import InvalidInput
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.domain.ledger import HOUR, LedgerEntry, LedgerPage
from punctual.domain.occurrence import OccurrenceState
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from punctual.timing import utc_text
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, client_error
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.reconciler.helpers import (
    at,
    materialize_until,
    reconcile,
    shards_of,
    stored,
)


def _set(aws: Services, oid: str, state: str, attempts: int = 1) -> None:
    """What a worker's run left on the occurrence (its item, as the worker SDK writes it)."""
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(oid)),
        UpdateExpression="SET #s = :s, attempt_count = :a",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues=to_dynamo({":s": state, ":a": attempts}),
    )


def _delete(aws: Services, oid: str) -> None:
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(oid))
    )


def _pages(api: Api, **query: Any) -> list[dict[str, Any]]:
    """Every page of the ledger for ``query``, following next_token."""
    answers = []
    token = None
    while True:
        answer = api.get("/v1/occurrences", **query, **({"next_token": token} if token else {}))
        assert answer.status == 200, answer.body
        answers.append(answer.body)
        token = answer.body["next_token"]
        if token is None:
            return answers


@pytest.fixture
def hour(alice: Api, bob: Api, aws: Services, clock: Clock) -> dict[str, Any]:
    """10:00-11:00 of alice's three */10 schedules and bob's one, checked at 12:05: one of
    alice's DEAD, one retried and SUCCEEDED, one deleted (MISSING, repaired), one
    SKIPPED_OVERLAP; bob's one DEAD; every other SUCCEEDED at its first attempt."""
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 7 * 86400}
    ours = [make(aws, spec=cron_spec("*/10 * * * *"), misfire=misfire) for _ in range(3)]
    theirs = make(aws, "bob", spec=cron_spec("*/10 * * * *"), misfire=misfire)
    materialize_until(aws, clock, at("11:00"), shards_of(aws, [*ours, theirs]))
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    for occurrence in window:
        _set(aws, occurrence["occurrence_id"], "SUCCEEDED")
    by_schedule = {
        sid: [o["occurrence_id"] for o in window if o["schedule_id"] == sid]
        for sid in [*ours, theirs]
    }
    dead, retried, skipped = (
        by_schedule[ours[0]][1],
        by_schedule[ours[1]][2],
        by_schedule[ours[2]][5],
    )
    missing = by_schedule[ours[0]][3]
    _set(aws, dead, "DEAD", attempts=3)
    _set(aws, retried, "SUCCEEDED", attempts=2)
    _set(aws, skipped, "SKIPPED_OVERLAP", attempts=0)
    _set(aws, by_schedule[theirs][0], "DEAD")
    _delete(aws, missing)
    clock.now = at("12:05")
    reconcile(aws, at("10:00"), at("11:00"))
    return {
        "ours": ours,
        "theirs": theirs,
        "dead": dead,
        "retried": retried,
        "skipped": skipped,
        "missing": missing,
        "total": sum(len(by_schedule[s]) for s in ours),
    }


def test_ledger_lists_a_checked_hours_exceptions_in_time_order_and_counts_the_rest(
    alice: Api, hour: dict[str, Any]
):
    # WHEN alice reads the ledger of the checked hour
    [page] = _pages(alice, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    # THEN exactly her four exceptions are listed, in time order, each with what it came to
    listed = {o["occurrence_id"]: o for o in page["occurrences"]}
    assert set(listed) == {hour["dead"], hour["retried"], hour["skipped"], hour["missing"]}
    assert [o["scheduled_for"] for o in page["occurrences"]] == sorted(
        o["scheduled_for"] for o in page["occurrences"]
    )
    assert (listed[hour["dead"]]["state"], listed[hour["dead"]]["attempts"]) == ("DEAD", 3)
    assert listed[hour["retried"]]["state"] == "SUCCEEDED"
    assert listed[hour["retried"]]["finding"] == "SUCCEEDED"
    assert listed[hour["skipped"]]["finding"] == "SKIPPED_OVERLAP"
    # (the deleted one was found MISSING and fired again by the check)
    assert listed[hour["missing"]]["finding"] == "MISSING"
    assert listed[hour["missing"]]["state"] == "SCHEDULED"
    assert all(o["target"] == "default" for o in page["occurrences"])
    # AND the hour's counts cover every one of her fires, checked on every shard
    [summary] = page["hours"]
    assert summary["hour"] == utc_text(at("10:00"))
    assert summary["shards_checked"] == summary["shards"] == 2  # (this folder: two shards)
    assert sum(summary["counts"].values()) == hour["total"]
    assert summary["counts"]["DEAD"] == 1
    assert summary["counts"]["MISSING"] == 1
    assert summary["counts"]["SUCCEEDED"] == hour["total"] - 3
    assert summary["retried"] == 2  # (the DEAD one's three attempts and the retried one)
    assert page["upcoming_complete"] is True  # (the range is past: nothing to compute)


def test_ledger_never_shows_another_tenants_occurrences(bob: Api, hour: dict[str, Any]):
    [page] = _pages(bob, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    assert [o["schedule_id"] for o in page["occurrences"]] == [hour["theirs"]]
    assert sum(page["hours"][0]["counts"].values()) == 6


def test_ledger_pages_through_every_item_once_in_order_and_each_hour_once(
    alice: Api, hour: dict[str, Any], clock: Clock
):
    # GIVEN a range of the checked hour, the unchecked ones after it and the next half hour
    query = {"from": utc_text(at("10:00")), "to": utc_text(at("12:35")), "limit": 2}
    # WHEN it is read two items at a time
    pages = _pages(alice, **query)
    items = [o for p in pages for o in p["occurrences"]]
    # THEN every item comes once, in (instant, id) order
    keys = [(o["scheduled_for"], o["occurrence_id"]) for o in items]
    assert keys == sorted(set(keys))
    recorded = [o for o in items if o["state"] != "UPCOMING"]
    assert len(recorded) == 4 + 3
    # (the 11:00 hour is not checked yet: read live, its three fires made ahead of the walk
    # and never run are still in flight, with their times)
    live = [o for o in recorded if o["scheduled_for"] >= utc_text(at("11:00"))]
    assert [(o["state"], o["finding"]) for o in live] == [("SCHEDULED", "IN_FLIGHT")] * 3
    assert all(o["available_at"] == o["scheduled_for"] for o in live)
    # AND the upcoming fires are the three schedules' */10 fires from now (12:05) to 12:35
    upcoming = [o for o in items if o["state"] == "UPCOMING"]
    assert sorted(o["scheduled_for"] for o in upcoming) == sorted(
        utc_text(at(t)) for t in ("12:10", "12:20", "12:30") for _ in range(3)
    )
    assert {o["schedule_id"] for o in upcoming} == set(hour["ours"])
    # AND each hour gone by is summarized once: 10:00 checked, 11:00 and 12:00 read live
    hours = [h for p in pages for h in p["hours"]]
    assert [(h["hour"], h["shards_checked"], h["live"]) for h in hours] == [
        (utc_text(at("10:00")), 2, False),
        (utc_text(at("11:00")), 0, True),
        (utc_text(at("12:00")), 0, True),
    ]
    assert hours[1]["counts"] == {"IN_FLIGHT": 3}
    # AND the whole answer is the same as one page's
    [whole] = _pages(alice, **{**query, "limit": 100})
    assert whole["occurrences"] == items
    assert whole["hours"] == hours


def test_ledger_filters_by_state_finding_and_target(alice: Api, hour: dict[str, Any]):
    span = {"from": utc_text(at("10:00")), "to": utc_text(at("12:35"))}
    [dead] = _pages(alice, **span, state="DEAD")
    assert [o["occurrence_id"] for o in dead["occurrences"]] == [hour["dead"]]
    [both] = _pages(alice, **span, state="DEAD,SKIPPED_OVERLAP")
    assert {o["occurrence_id"] for o in both["occurrences"]} == {hour["dead"], hour["skipped"]}
    # (state MISSING: no occurrence at all; the repaired one's is SCHEDULED, found MISSING)
    [never] = _pages(alice, **span, state="MISSING")
    assert never["occurrences"] == []
    [repaired] = _pages(alice, **span, finding="MISSING")
    assert [o["occurrence_id"] for o in repaired["occurrences"]] == [hour["missing"]]
    [found] = _pages(alice, **span, finding="SKIPPED_OVERLAP")
    assert [o["occurrence_id"] for o in found["occurrences"]] == [hour["skipped"]]
    [upcoming] = _pages(alice, **span, state="UPCOMING")
    assert len(upcoming["occurrences"]) == 9
    [elsewhere] = _pages(alice, **span, target="other")
    assert elsewhere["occurrences"] == []


def test_ledger_leaves_out_paused_schedules_upcoming_fires(alice: Api, hour: dict[str, Any]):
    assert alice.post(f"/v1/schedules/{hour['ours'][0]}/pause").status == 200
    [page] = _pages(alice, state="UPCOMING", to=utc_text(at("12:35")))
    assert {o["schedule_id"] for o in page["occurrences"]} == set(hour["ours"][1:])


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "2026-11-19T11:00:00Z", "to": "2026-11-19T10:00:00Z"}, "to"),
        ({"from": "2026-11-19T10:00:00Z", "to": "2026-11-29T10:00:00Z"}, "to"),
        ({"from": "2026-09-01T10:00:00Z", "to": "2026-09-02T10:00:00Z"}, "from"),
        ({"state": "DEAD,LOST"}, "state"),
        ({"finding": "GONE"}, "finding"),
        ({"target": "not a name"}, "target"),
        ({"limit": 0}, "limit"),
        ({"listing": "some"}, "listing"),
        ({"next_token": "bm90IGEgdG9rZW4"}, "next_token"),
    ],
)
def test_ledger_refuses_bad_input_naming_the_field(
    alice: Api, clock: Clock, query: dict[str, Any], field: str
):
    clock.now = at("12:05")
    answer = alice.get("/v1/occurrences", **query)
    assert answer.status == 400, answer.body
    assert field in str(answer.body)


def test_ledger_token_is_bound_to_its_query(alice: Api, hour: dict[str, Any]):
    span = {"from": utc_text(at("10:00")), "to": utc_text(at("12:35")), "limit": 1}
    token = alice.get("/v1/occurrences", **span).body["next_token"]
    assert token is not None
    # (the same query goes on; another range or filter with its token is refused)
    assert alice.get("/v1/occurrences", **span, next_token=token).status == 200
    assert alice.get("/v1/occurrences", next_token=token).status == 200  # (range from it)
    moved = {**span, "from": utc_text(at("10:10"))}
    assert alice.get("/v1/occurrences", **moved, next_token=token).status == 400
    assert alice.get("/v1/occurrences", **span, state="DEAD", next_token=token).status == 400


def _one_dead(aws: Services, clock: Clock) -> tuple[list[int], str]:
    """10:00-11:00 of a */30 schedule, its first fire DEAD and its second SUCCEEDED, at
    12:05: the schedule's shards and the DEAD one's id."""
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/30 * * * *"))
    materialize_until(aws, clock, at("11:00"), shards_of(aws, [sid]))
    [first, second] = [
        o["occurrence_id"] for o in stored(aws, since=at("10:00"), until=at("11:00"))
    ]
    _set(aws, first, "DEAD")
    _set(aws, second, "SUCCEEDED")
    clock.now = at("12:05")
    return shards_of(aws, [sid]), first


def test_an_incomplete_check_writes_no_page_and_the_next_one_does(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an hour of a schedule with one DEAD occurrence
    shards, dead = _one_dead(aws, clock)
    # WHEN a check runs out of time before its first schedule
    [result] = Reconciler(aws, out_of_time=lambda: True).run(shards, at("10:00"), at("11:00"))
    assert not result.report.complete
    # THEN the hour has no page, and shows as not checked on that shard (read live)
    assert list(aws.ledger.pages("alice", at("10:00"), at("10:00"))) == []
    answer = Ledger(aws).read(
        "alice", since=at("10:00"), until=at("11:00"), wanted=LedgerFilter(), limit=9, token=None
    )
    assert (answer.hours[0].shards_checked, answer.hours[0].live) == (0, True)
    # AND a complete check writes it
    reconcile(aws, at("10:00"), at("11:00"))
    [page] = aws.ledger.pages("alice", at("10:00"), at("10:00"))
    assert [e.occurrence_id for e in page.entries] == [dead]


def test_a_check_whose_ledger_write_is_throttled_is_incomplete_and_checked_again(
    alice: Api, aws: Services, clock: Clock
):
    shards, dead = _one_dead(aws, clock)
    # GIVEN a ledger table that throttles every write (past the client's own retries)
    faults = Faults(FaultPlan(), clock)

    def throttled_ledger(operation: str, request: dict[str, Any]) -> None:
        if request["TableName"] == aws.settings.ledger_table:
            raise client_error("ThrottlingException", operation)

    faults.before["put_item"] = throttled_ledger
    throttled = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN the hour is checked
    [result] = Reconciler(throttled, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN the check is reported incomplete (so the scheduled run checks it again)
    assert not result.report.complete
    assert not result.report.settled
    assert list(aws.ledger.pages("alice", at("10:00"), at("10:00"))) == []
    # AND once writes pass, the check writes the page
    reconcile(aws, at("10:00"), at("11:00"))
    [page] = aws.ledger.pages("alice", at("10:00"), at("10:00"))
    assert [e.occurrence_id for e in page.entries] == [dead]


def test_a_slow_older_check_never_puts_back_older_states(aws: Services):
    # (the race: a check retried or slow finishing after a later check of the same hour)
    hour = at("10:00")
    newer = LedgerPage(
        tenant_id="alice", hour=hour, shard=1, checked_at=at("13:05"), counts={Finding.DEAD: 1}
    )
    older = newer.model_copy(update={"checked_at": at("12:05"), "counts": {Finding.IN_FLIGHT: 1}})
    assert aws.ledger.put(newer, purge_at=at("13:05") + 86400)
    assert not aws.ledger.put(older, purge_at=at("13:05") + 86400)
    [kept] = list(aws.ledger.pages("alice", hour, hour))
    assert kept.counts == {Finding.DEAD: 1}
    assert aws.ledger.put_checked(hour, 1, checked_at=at("13:05"), purge_at=at("14:00"))
    assert not aws.ledger.put_checked(hour, 1, checked_at=at("12:05"), purge_at=at("14:00"))
    assert aws.ledger.checked(hour, hour) == {hour: {1: at("13:05")}}


def test_a_page_the_reader_cannot_read_is_skipped_and_counted(aws: Services):
    hour = at("10:00")
    good = LedgerPage(tenant_id="alice", hour=hour, shard=0, checked_at=hour + 7200, counts={})
    aws.ledger.put(good, purge_at=hour + 86400)
    aws.dynamodb.put_item(
        TableName=aws.settings.ledger_table,
        Item=to_dynamo({"pk": ledger_pk("alice", hour), "sk": ledger_sk(hour, 1), "counts": "?"}),
    )
    assert [p.shard for p in aws.ledger.pages("alice", hour, hour)] == [0]
    assert aws.bad_items.count == 1


def _put_dead_page(
    aws: Services, hour: int, shard: int, instants: dict[str, int]
) -> list[LedgerEntry]:
    """Alice's page of the hour and shard, checked at hour + 7500, listing a DEAD occurrence
    of each schedule at its instant (in order); its entries."""
    entries = sorted(
        (
            LedgerEntry(
                occurrence_id=occurrence_id(sid, 1, at),
                schedule_id=sid,
                scheduled_for=at,
                finding=Finding.DEAD,
                state=OccurrenceState.DEAD,
            )
            for sid, at in instants.items()
        ),
        key=lambda e: e.order,
    )
    page = LedgerPage(
        tenant_id="alice",
        hour=hour,
        shard=shard,
        checked_at=hour + 7500,
        counts={Finding.DEAD: len(entries)},
        entries=entries,
    )
    assert aws.ledger.put(page, purge_at=hour + 86400)
    return entries


def test_ledger_reads_across_days_in_order_a_page_at_a_time(aws: Services, clock: Clock):
    # GIVEN pages on both sides of midnight, on two shards, and marks of some hours
    first = at("22:00")
    hours = [first + k * 3600 for k in range(4)]  # 22:00, 23:00, 00:00, 01:00
    made = []
    for k, hour in enumerate(hours):
        for shard in (0, 1):
            instants = {f"sch_alice.s{shard}{j}": hour + 60 * (j + k) for j in range(3)}
            made += _put_dead_page(aws, hour, shard, instants)
        if k != 1:
            aws.ledger.put_checked(hour, 0, checked_at=hour + 7500, purge_at=hour + 86400)
            aws.ledger.put_checked(hour, 1, checked_at=hour + 7500, purge_at=hour + 86400)
    clock.now = first + 5 * 3600
    # WHEN read four items at a time
    listed, summaries, token = [], [], None
    while True:
        answer = Ledger(aws).read(
            "alice",
            since=first,
            until=first + 4 * 3600,
            wanted=LedgerFilter(),
            limit=4,
            token=token,
        )
        listed += answer.items
        summaries += answer.hours
        token = answer.next_token
        if token is None:
            break
    # THEN every entry of a marked hour comes once, in order, across the day (the 23:00
    # pages have no mark: a check that stopped before it; they are not the hour as checked)
    assert [i.occurrence_id for i in listed] == [
        e.occurrence_id
        for e in sorted(made, key=lambda e: e.order)
        if not hours[1] <= e.scheduled_for < hours[2]
    ]
    # AND each hour is summed over its marked shards once
    assert [(h.hour, h.shards_checked, h.counts[Finding.DEAD]) for h in summaries] == [
        (hours[0], 2, 6),
        (hours[1], 0, 0),
        (hours[2], 2, 6),
        (hours[3], 2, 6),
    ]


def test_ledger_reads_the_hours_not_checked_yet_live_with_every_occurrence_on_request(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a */30 schedule's fires of 10:00-11:00 (one DEAD, one SUCCEEDED), not checked
    _, dead = _one_dead(aws, clock)
    [ok] = [
        o["occurrence_id"]
        for o in stored(aws, since=at("10:00"), until=at("11:00"))
        if o["occurrence_id"] != dead
    ]
    span = {"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))}
    # WHEN the ledger is read at 12:05 (the hour ended an hour ago, no check yet)
    [page] = _pages(alice, **span)
    # THEN the DEAD one is listed at once, with its times, and the hour counted live
    [listed] = page["occurrences"]
    assert (listed["occurrence_id"], listed["state"], listed["finding"]) == (dead, "DEAD", "DEAD")
    assert listed["available_at"] == utc_text(at("10:00"))
    [hour] = page["hours"]
    assert (hour["live"], hour["shards_checked"]) == (True, 0)
    assert hour["counts"] == {"DEAD": 1, "SUCCEEDED": 1}
    # AND listing=all lists the success too
    [every] = _pages(alice, **span, listing="all")
    assert [o["occurrence_id"] for o in every["occurrences"]] == [dead, ok]
    # AND an hour older than three hours, unchecked, is not read live (its pages: none)
    clock.now = at("14:05")
    [old] = _pages(alice, **span)
    assert (old["occurrences"], old["hours"][0]["live"]) == ([], False)
    # AND a tenant with as many schedules as the ledger reads live is read; one with more
    # says so, and lists none
    clock.now = at("12:05")
    monkeypatch.setattr("punctual.control.ledger.MAX_LIVE_SCHEDULES", 1)
    [full] = _pages(alice, **span)
    assert (len(full["occurrences"]), full["live_complete"]) == (1, True)
    monkeypatch.setattr("punctual.control.ledger.MAX_LIVE_SCHEDULES", 0)
    [crowded] = _pages(alice, **span)
    assert (crowded["occurrences"], crowded["live_complete"]) == ([], False)
    # (the same bound for the upcoming fires: as many active schedules as it computes, or
    # more)
    monkeypatch.setattr("punctual.control.ledger.MAX_SCHEDULES", 1)
    [one] = _pages(alice, state="UPCOMING", to=utc_text(at("13:05")))
    assert (len(one["occurrences"]), one["upcoming_complete"]) == (2, True)
    # (only the active ones count: a paused one beside it is not read for upcoming fires)
    paused = make(aws, spec=cron_spec("0 * * * *"))
    ControlPlane(aws).pause("alice", paused)
    [still] = _pages(alice, state="UPCOMING", to=utc_text(at("13:05")))
    assert (len(still["occurrences"]), still["upcoming_complete"]) == (2, True)
    monkeypatch.setattr("punctual.control.ledger.MAX_SCHEDULES", 0)
    [none] = _pages(alice, state="UPCOMING", to=utc_text(at("13:05")))
    assert (none["occurrences"], none["upcoming_complete"]) == ([], False)
    # AND an item of the schedule no reader can parse, in a live hour, is counted in that
    # hour as unreadable (the tenant's bad data), the rest as before
    monkeypatch.setattr("punctual.control.ledger.MAX_LIVE_SCHEDULES", 500)
    sid = stored(aws, since=at("10:00"), until=at("11:00"))[0]["schedule_id"]
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id(sid, 1, at("10:10")))),
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": "SUCCEEDED"}},
    )
    [bad] = _pages(alice, **span)
    [counted] = bad["hours"]
    assert (counted["unreadable"], counted["counts"]) == (1, {"DEAD": 1, "SUCCEEDED": 1})


def test_ledger_lists_a_dead_occurrence_of_the_current_hour_at_once(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/10 * * * *"))
    make(aws, "bob", spec=cron_spec("*/10 * * * *"))
    materialize_until(aws, clock, at("10:05"), shards_of(aws, [sid]))
    [first] = [
        o["occurrence_id"]
        for o in stored(aws, since=at("10:00"), until=at("10:01"))
        if o["schedule_id"] == sid
    ]
    _set(aws, first, "DEAD", attempts=3)
    clock.now = at("10:07")
    [page] = _pages(alice, state="DEAD", to=utc_text(at("10:30")))
    assert [(o["occurrence_id"], o["attempts"]) for o in page["occurrences"]] == [(first, 3)]
    # (bob reads his own hour: nothing of alice's)
    [theirs] = _pages(bob, to=utc_text(at("10:30")), listing="all")
    assert all(o["schedule_id"].startswith("sch_bob.") for o in theirs["occurrences"])


def test_ledger_pages_end_inside_ties_and_give_every_item_once(aws: Services, clock: Clock):
    # GIVEN four schedules' exceptions at one instant on each of two shards (ties across
    # schedules and shards), marked checked
    hour = at("10:00")
    made = []
    for shard in (0, 1):
        instants = {f"sch_alice.t{shard}{j}": hour + 60 * (j % 2) for j in range(4)}
        made += _put_dead_page(aws, hour, shard, instants)
        aws.ledger.put_checked(hour, shard, checked_at=hour + 7500, purge_at=hour + 86400)
    clock.now = at("14:00")

    def read(limit: int) -> list[str]:
        found, token = [], None
        while True:
            answer = Ledger(aws).read(
                "alice",
                since=hour,
                until=hour + 3600,
                wanted=LedgerFilter(),
                limit=limit,
                token=token,
            )
            found += [i.occurrence_id for i in answer.items]
            token = answer.next_token
            if token is None:
                return found

    # WHEN read 1, 3 and 100 at a time THEN each gives every item once, in the same order
    whole = read(100)
    assert whole == [e.occurrence_id for e in sorted(made, key=lambda e: e.order)]
    assert read(1) == whole
    assert read(3) == whole


def test_a_renamed_schedules_upcoming_fires_name_the_occurrences_it_will_make(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */10 schedule renamed (a new version, the same run version)
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/10 * * * *"))
    assert ControlPlane(aws).update("alice", sid, if_match=1, changes={"name": "renamed"})
    # WHEN its upcoming fires are read, and later made by the materializer
    [page] = _pages(alice, state="UPCOMING", to=utc_text(at("10:25")))
    materialize_until(aws, clock, at("10:25"), shards_of(aws, [sid]))
    made = {o["occurrence_id"] for o in stored(aws, since=at("09:40"), until=at("10:25"))}
    # THEN each upcoming id is one the materializer made (09:40 to 10:20)
    assert {o["occurrence_id"] for o in page["occurrences"]} == made
    assert len(made) == 5


def test_a_repaired_fire_stays_listed_after_the_hour_is_checked_again(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */30 schedule whose 10:30 fire was lost, one under SKIP that can no longer
    # fire (recorded MISSED by the repair), and the rest SUCCEEDED
    clock.now = at("09:40")
    fire = make(aws, spec=cron_spec("*/30 * * * *"), misfire={"max_lateness_seconds": 86400})
    skip = make(
        aws, spec=cron_spec("*/30 * * * *"), misfire={"action": "SKIP", "max_lateness_seconds": 60}
    )
    materialize_until(aws, clock, at("11:00"), shards_of(aws, [fire, skip]))
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    for o in window:
        _set(aws, o["occurrence_id"], "SUCCEEDED")
    lost = {
        o["schedule_id"]: o["occurrence_id"] for o in window if o["scheduled_for"] == at("10:30")
    }
    for oid in lost.values():
        _delete(aws, oid)
    # WHEN the hour is checked (one fired again late, one recorded MISSED), the late one runs,
    # and the hour is checked again
    clock.now = at("12:05")
    reconcile(aws, at("10:00"), at("11:00"))
    _set(aws, lost[fire], "SUCCEEDED")
    clock.now = at("13:05")
    reconcile(aws, at("10:00"), at("11:00"))
    # THEN both stay listed: the repaired one as made late, the other MISSED
    [page] = _pages(alice, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    listed = {o["occurrence_id"]: o for o in page["occurrences"]}
    assert set(listed) == set(lost.values())
    assert (listed[lost[fire]]["state"], listed[lost[fire]]["late"]) == ("SUCCEEDED", True)
    assert listed[lost[skip]]["state"] == "MISSED"
    assert page["hours"][0]["late"] == 1


def test_a_check_whose_mark_is_not_written_counts_none_of_its_pages(
    alice: Api, aws: Services, clock: Clock
):
    shards, dead = _one_dead(aws, clock)
    clock.now = at("14:05")  # (older than the hours read live)
    # GIVEN the mark's write throttled past the client's retries, after the pages
    faults = Faults(FaultPlan(), clock)

    def no_mark(operation: str, request: dict[str, Any]) -> None:
        if request["TableName"] == aws.settings.ledger_table and "#checked#" in str(
            request["Item"]["pk"]
        ):
            raise client_error("ThrottlingException", operation)

    faults.before["put_item"] = no_mark
    throttled = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    [result] = Reconciler(throttled, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN the check is incomplete, and the ledger counts nothing of it
    assert not result.report.complete
    assert list(aws.ledger.pages("alice", at("10:00"), at("10:00")))  # (written)
    [page] = _pages(alice, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    assert (page["occurrences"], page["hours"][0]["counts"]) == ([], {})
    # AND the next check writes its mark, and the hour is listed (once the API's copy of
    # the marks, a minute old at most, is read again)
    reconcile(aws, at("10:00"), at("11:00"))
    clock.advance(61)
    [page] = _pages(alice, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    assert [o["occurrence_id"] for o in page["occurrences"]] == [dead]


def test_a_tenants_forged_items_never_fail_another_tenants_page_or_the_check(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    # GIVEN alice's and bob's schedules on one shard, each with a DEAD occurrence; alice's
    # worker wrote a huge target of no target's name into one of hers
    clock.now = at("09:40")
    ours = make(aws, spec=cron_spec("*/30 * * * *"))
    theirs = make(aws, "bob", spec=cron_spec("*/30 * * * *"))
    shards = shards_of(aws, [ours, theirs])
    materialize_until(aws, clock, at("11:00"), shards)
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    for o in window:
        _set(aws, o["occurrence_id"], "DEAD")
    forged = next(o["occurrence_id"] for o in window if o["schedule_id"] == ours)
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(forged)),
        UpdateExpression="SET target = :t",
        ExpressionAttributeValues=to_dynamo({":t": "漢" * 120_000}),
    )
    # ... AND DynamoDB refusing alice's page whatever it holds (as it would one too large)
    faults = Faults(FaultPlan(), clock)

    def refuse_alices(operation: str, request: dict[str, Any]) -> None:
        if str(request["Item"].get("pk", {}).get("S", "")).startswith("alice#"):
            raise client_error("ValidationException", operation)

    faults.before["put_item"] = refuse_alices
    refusing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN the hour is checked
    clock.now = at("14:05")
    results = Reconciler(refusing, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN the check completes, and bob's page is written and listed
    assert all(r.report.complete for r in results)
    [page] = _pages(bob, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    assert len(page["occurrences"]) == 2
    # AND without the refusal alice's page lists her DEAD ones, the forged target left out
    reconcile(aws, at("10:00"), at("11:00"))
    [mine] = _pages(alice, **{"from": utc_text(at("10:00")), "to": utc_text(at("11:00"))})
    targets = {o["occurrence_id"]: o["target"] for o in mine["occurrences"]}
    assert targets[forged] is None
    assert len(targets) == 2


def test_a_check_again_writes_only_the_pages_that_changed(alice: Api, aws: Services, clock: Clock):
    # GIVEN an hour checked once, and a client counting the ledger's page writes
    shards, _ = _one_dead(aws, clock)
    reconcile(aws, at("10:00"), at("11:00"))
    faults = Faults(FaultPlan(), clock)
    written: list[str] = []

    def count(operation: str, request: dict[str, Any]) -> None:
        if request["TableName"] == aws.settings.ledger_table:
            written.append(str(request["Item"]["pk"]["S"]))

    faults.before["put_item"] = count
    counted = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN it is checked again with nothing changed
    clock.advance(3600)
    Reconciler(counted, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN only the hour's mark is written, not the page
    assert [pk.startswith("#checked#") for pk in written] == [True]
    # AND when an occurrence's state changed, the page is written again
    [other] = [
        o["occurrence_id"]
        for o in stored(aws, since=at("10:00"), until=at("11:00"))
        if o["state"] == "SUCCEEDED"
    ]
    _set(aws, other, "DEAD")
    written.clear()
    clock.advance(3600)
    Reconciler(counted, workers=1).run(shards, at("10:00"), at("11:00"))
    assert sorted(pk.startswith("#checked#") for pk in written) == [False, True]
    [page] = aws.ledger.pages("alice", at("10:00"), at("10:00"))
    assert len(page.entries) == 2


# --- what the mutation run's survivors showed untested (issue 47) -----------------------


def _read_ledger(
    aws: Services,
    since: int | None,
    until: int | None,
    *,
    wanted: LedgerFilter | None = None,
    limit: int = 100,
    token: str | None = None,
) -> LedgerAnswer:
    return Ledger(aws).read(
        "alice",
        since=since,
        until=until,
        wanted=wanted or LedgerFilter(),
        limit=limit,
        token=token,
    )


def _checked(aws: Services, hour: int, shards: tuple[int, ...] = (0, 1), late: int = 0) -> None:
    """Mark the hour checked on ``shards`` at hour + 7500 (+ ``late`` on the last one)."""
    for shard in shards:
        checked_at = hour + 7500 + (late if shard == shards[-1] else 0)
        aws.ledger.put_checked(hour, shard, checked_at=checked_at, purge_at=hour + 86400)


def test_ledger_summarizes_a_checked_hour_with_its_latest_check_and_reads_nothing_live(
    aws: Services, clock: Clock
):
    # GIVEN an hour with a page on each shard, shard 1's check marked a minute after shard 0's
    hour = at("10:00")
    _put_dead_page(aws, hour, 0, {"sch_alice.a": hour + 60})
    _put_dead_page(aws, hour, 1, {"sch_alice.b": hour + 120})
    _checked(aws, hour, late=60)
    clock.now = at("14:00")
    # WHEN the hour is read
    answer = _read_ledger(aws, hour, hour + HOUR)
    # THEN its summary names every shard checked and the latest check
    [summary] = answer.hours
    assert (summary.shards_checked, summary.checked_at) == (2, hour + 7560)
    assert (summary.live, summary.counts[Finding.DEAD]) == (False, 2)
    # AND no hour needed a live read: the answer is live complete
    assert answer.live_complete is True


def test_ledger_reads_an_unchecked_hour_live_until_three_hours_after_it_began(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an unchecked hour (10:00) with a DEAD occurrence
    _, dead = _one_dead(aws, clock)
    # WHEN it is read at 13:05 (the hour three hours before the current one's)
    clock.now = at("13:05")
    answer = _read_ledger(aws, at("10:00"), at("11:00"))
    # THEN it is still read live: the DEAD one is listed
    assert [i.occurrence_id for i in answer.items] == [dead]
    assert answer.hours[0].live is True


def test_ledger_counts_no_page_of_a_shard_the_deployment_does_not_have(aws: Services, clock: Clock):
    # GIVEN an hour with pages and marks of shards 0, 1 and 2, on a two-shard deployment
    hour = at("10:00")
    kept = []
    for shard in (0, 1, 2):
        made = _put_dead_page(aws, hour, shard, {f"sch_alice.s{shard}": hour + 60 * shard})
        if shard < 2:
            kept += made
    _checked(aws, hour, (0, 1, 2))
    clock.now = at("14:00")
    # WHEN the hour is read
    answer = _read_ledger(aws, hour, hour + HOUR)
    # THEN shard 2's page is neither listed nor counted
    assert [i.occurrence_id for i in answer.items] == [e.occurrence_id for e in kept]
    assert answer.hours[0].counts == {Finding.DEAD: 2}


def test_ledger_lists_only_the_entries_of_an_hour_inside_a_range_that_cuts_it(
    aws: Services, clock: Clock
):
    # GIVEN a checked hour's page with entries at 10:00, 10:30 and 10:45
    hour = at("10:00")
    instants = {"sch_alice.a": at("10:00"), "sch_alice.b": at("10:30"), "sch_alice.c": at("10:45")}
    _put_dead_page(aws, hour, 0, instants)
    _checked(aws, hour)
    clock.now = at("14:00")
    # WHEN [10:15, 10:45) is read
    answer = _read_ledger(aws, at("10:15"), at("10:45"))
    # THEN only the 10:30 entry is listed: not one before from, nor one at to
    assert [i.scheduled_for for i in answer.items] == [at("10:30")]


def test_ledger_reads_a_range_that_ends_in_the_hour_after_midnight(aws: Services, clock: Clock):
    # GIVEN checked pages of 23:00 and of 00:00 the next day
    late, midnight = at("23:00"), at("00:00", day="2026-11-20")
    made = []
    for hour in (late, midnight):
        made += _put_dead_page(aws, hour, 0, {"sch_alice.a": hour + 60})
        _checked(aws, hour)
    clock.now = midnight + 4 * HOUR
    # WHEN [23:00, 01:00) is read
    answer = _read_ledger(aws, late, midnight + HOUR)
    # THEN both hours are summarized and listed, the one after midnight too
    assert [h.hour for h in answer.hours] == [late, midnight]
    assert [i.occurrence_id for i in answer.items] == [e.occurrence_id for e in made]


def test_ledger_reads_the_first_hour_of_the_epoch(aws: Services, clock: Clock):
    # GIVEN a checked page of the hour 0 (a clock a few hours after the epoch)
    [made] = _put_dead_page(aws, 0, 0, {"sch_alice.a": 60})
    _checked(aws, 0)
    clock.now = 5 * HOUR
    # WHEN [0, 2h) is read
    answer = _read_ledger(aws, 0, 2 * HOUR)
    # THEN its hours are the aligned ones, and hour 0's entry is listed
    assert [h.hour for h in answer.hours] == [0, HOUR]
    assert [i.occurrence_id for i in answer.items] == [made.occurrence_id]


def test_ledger_refuses_a_token_with_another_to(aws: Services, clock: Clock):
    # GIVEN a checked hour with two entries, and the token after the first
    hour = at("10:00")
    _put_dead_page(aws, hour, 0, {"sch_alice.a": hour + 60, "sch_alice.b": hour + 120})
    _checked(aws, hour)
    clock.now = at("14:00")
    token = _read_ledger(aws, hour, hour + HOUR, limit=1).next_token
    assert token is not None
    # WHEN the next page is asked with the same from and another to
    # THEN the token is refused (it was made for the other range)
    with pytest.raises(InvalidInput) as refused:
        _read_ledger(aws, hour, hour + HOUR // 2, limit=1, token=token)
    assert refused.value.message == "next_token is not valid"


def test_ledger_reads_the_last_day_and_the_next_hour_by_default(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */10 schedule made at 09:40
    clock.now = at("09:40")
    make(aws, spec=cron_spec("*/10 * * * *"))
    # WHEN the ledger is read with no range
    answer = _read_ledger(aws, None, None)
    # THEN it covers the last day's hours and the next hour's fires (09:40 to 10:30)
    assert [h.hour for h in answer.hours] == list(
        range(at("09:00") - 24 * HOUR, at("09:00") + 1, HOUR)
    )
    assert [i.scheduled_for for i in answer.items if isinstance(i, Upcoming)] == [
        at(t) for t in ("09:40", "09:50", "10:00", "10:10", "10:20", "10:30")
    ]


def test_ledger_filtered_by_a_target_lists_its_recorded_and_upcoming_items(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */30 schedule of target default: a DEAD occurrence at 10:00, fires to come
    _, dead = _one_dead(aws, clock)
    span = (at("10:00"), at("13:05"))
    everything = _read_ledger(aws, *span).items
    assert dead in [i.occurrence_id for i in everything]
    assert any(isinstance(i, Upcoming) for i in everything)
    # WHEN it is read filtered by that target
    filtered = _read_ledger(aws, *span, wanted=LedgerFilter(target="default")).items
    # THEN it lists the same: the recorded items and the upcoming fires
    assert filtered == everything


def test_ledger_reads_every_page_of_the_schedules_for_the_upcoming_fires(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN two hourly schedules, read one schedule a page, three at most
    clock.now = at("09:40")
    made = {make(aws, spec=cron_spec("0 * * * *")) for _ in range(2)}
    monkeypatch.setattr("punctual.control.ledger._PAGE", 1)
    monkeypatch.setattr("punctual.control.ledger.MAX_SCHEDULES", 3)
    # WHEN the upcoming fires are read
    answer = _read_ledger(
        aws, clock.now, at("10:05"), wanted=LedgerFilter(states=frozenset({"UPCOMING"}))
    )
    # THEN both schedules' fires are listed, and the answer is complete
    assert answer.upcoming_complete is True
    assert {i.schedule_id for i in answer.items} == made


def test_ledger_computes_no_fires_for_a_range_that_ends_now(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN an active schedule, and a bound of no schedule at all for the upcoming fires
    clock.now = at("09:40")
    make(aws, spec=cron_spec("*/10 * * * *"))
    monkeypatch.setattr("punctual.control.ledger.MAX_SCHEDULES", 0)
    # WHEN a range that ends now is read
    answer = _read_ledger(aws, at("09:00"), clock.now)
    # THEN no fire is to come in it: complete, whatever the bound (no schedule is read)
    assert answer.upcoming_complete is True


def test_ledger_refuses_a_range_naming_each_of_its_problems(aws: Services, clock: Clock):
    # GIVEN a range that ends before it starts and starts before what is kept
    clock.now = at("12:00")
    since = at("12:00") - 31 * 24 * HOUR
    # WHEN it is read
    with pytest.raises(InvalidInput) as refused:
        _read_ledger(aws, since, since - HOUR)
    # THEN the error names both problems, in its message and its fields
    assert refused.value.message == (
        "the range is not valid: to: must be later than from; "
        "from: occurrences are kept 30 days: not earlier"
    )
    assert refused.value.details["fields"] == [
        {"field": "to", "reason": "must be later than from"},
        {"field": "from", "reason": "occurrences are kept 30 days: not earlier"},
    ]


def test_a_token_of_any_length_names_its_position_again():
    # GIVEN positions whose last item's id is 1 to 20 characters long (tokens of every
    # length modulo 4 and 5: their padding is cut)
    query = (at("10:00"), at("12:00"), "abc")
    for n in range(1, 21):
        position = _Position(0, at("10:00"), (at("10:01"), "o" * n))
        # WHEN its token is decoded THEN it is the same position and query
        assert _decode(_encode(query, position)) == (position, query)


def test_a_token_with_a_character_not_of_base64_is_refused():
    # GIVEN a token whose base64 needs two characters of padding, and one character more
    # that base64 does not have
    query = (at("10:00"), at("12:00"), "abc")
    token = next(
        t
        for n in range(1, 9)
        if len(t := _encode(query, _Position(0, at("10:00"), (at("10:01"), "o" * n)))) % 4 == 2
    )
    # WHEN it is decoded THEN it is refused
    with pytest.raises(InvalidInput):
        _decode(token + "~")


def test_ledger_shows_when_an_occurrence_read_live_was_enqueued(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an unchecked hour's DEAD occurrence, enqueued a second after its time, with why
    _, dead = _one_dead(aws, clock)
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(dead)),
        UpdateExpression="SET enqueued_at = :e, reason = :r",
        ExpressionAttributeValues=to_dynamo({":e": at("10:00") + 1, ":r": "retries exhausted"}),
    )
    # WHEN the hour is read live
    [entry] = _read_ledger(aws, at("10:00"), at("11:00")).items
    # THEN its entry has when it was enqueued, and why it is DEAD
    assert isinstance(entry, LedgerEntry)
    assert (entry.occurrence_id, entry.enqueued_at) == (dead, at("10:00") + 1)
    assert entry.reason == "retries exhausted"

"""The reconciler's repairs under races and failures, on moto with the injected clock. A
superseded version's gap is recorded missed while the current version's fires are made, a
refused repair is retried once and then counted as a conflict, and a catch-up goes on past a
shard or window that fails. Slow catch-up paces are compressed into SQS's delay, repairs
larger than one transaction are made and counted chunk by chunk, and renames leave the run
version alone while a flexible fire due after one is still repaired."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.reports import ReportStore
from punctual.dal.tables import occurrence_key
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.pipeline.reconciler import (
    CATCHUP_WINDOWS,
    Reconciler,
    _ScheduleOutcome,
    _Tally,
    read_reports,
)
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, client_error
from tests.integration.conftest import Api, Clock, bootstrap
from tests.integration.helpers import cron_spec, make, patch, table_items
from tests.integration.reconciler.helpers import (
    at,
    ids,
    materialize_until,
    reconcile,
    shards_of,
    stored,
    total,
)

# --- repairs under races and failures -------------------------------------------------------


def occurrence_item(aws: Services, oid: str) -> dict[str, Any]:
    [item] = [
        i
        for i in table_items(aws, aws.settings.occurrences_table)
        if i.get("occurrence_id", {}).get("S") == oid and i["sk"]["S"].startswith("OCC#")
    ]
    return item


def test_reconciler_records_a_superseded_versions_gap_missed_and_fires_the_current_ones(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule (payload v1) whose 10:15 instant the materializer dropped, updated
    # at 10:22 (payload v2), whose version 2 then lost its 10:40 instant as well
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire, payload={"v": 1})
    shards = shards_of(aws, [sid])
    dropped = {at("10:15"), at("10:40")}
    materialize_until(aws, clock, at("10:20"), shards, skip=lambda s, t: t in dropped)
    clock.now = at("10:22")
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    materialize_until(aws, clock, at("11:10"), shards, skip=lambda s, t: t in dropped)
    old, new = occurrence_id(sid, 1, at("10:15")), occurrence_id(sid, 2, at("10:40"))
    # WHEN the reconciler checks and repairs [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN both are MISSING; version 1's is recorded MISSED (no worker would run a
    # superseded version's occurrence), with the reason, and version 2's fires now
    assert ids(results, "missing") == {old, new}
    assert ids(results, "recorded_missed") == {old}
    assert ids(results, "fired") == {new}
    missed = occurrence_item(aws, old)
    assert missed["state"]["S"] == "MISSED"
    assert missed["schedule_version"]["N"] == "1"
    assert missed["reason"]["S"] == "reconciler: missing; version 1 was superseded by 2"
    fired = occurrence_item(aws, new)
    assert (fired["state"]["S"], fired["available_at"]["N"]) == ("SCHEDULED", str(at("12:05")))
    # AND the repaired fire carries the current payload (the relay sends it without reading
    # the schedule), the MISSED record none
    assert fired["payload"] == {"M": {"v": {"N": "2"}}}
    assert missed["payload"] == {"M": {}}
    # AND the tenant reads both through the API (the MISSED record's item parses)
    answer = alice.get(f"/v1/occurrences/{old}")
    assert answer.status == 200, answer.body
    assert (answer.body["state"], answer.body["reason"]) == (
        "MISSED",
        "reconciler: missing; version 1 was superseded by 2",
    )
    assert alice.get(f"/v1/occurrences/{new}").body["state"] == "SCHEDULED"


@pytest.mark.parametrize("refusals", [1, 2])
def test_reconciler_retries_a_refused_repair_once_then_counts_a_conflict_keeping_the_deferred(
    alice: Api, aws: Services, clock: Clock, refusals: int
):
    # GIVEN a */5 schedule whose 10:15 instant was dropped and whose materializer stopped
    # after its 10:30 tick (the later instants of the hour are the materializer's to make)
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    materialize_until(
        aws, clock, at("10:30"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:15")
    )
    made = {o["scheduled_for"] for o in stored(aws, since=at("10:00"), until=at("11:00"))}
    later = {occurrence_id(sid, 1, t) for t in range(max(made) + 300, at("11:00"), 300)}
    assert later
    lost = occurrence_id(sid, 1, at("10:15"))
    # AND the repair's transaction refused (a conflict on the schedule, say) once or twice
    faults = Faults(FaultPlan.none(), clock)
    refused: list[str] = []

    def refuse(_: str, request: dict[str, Any]) -> None:
        puts = [a["Put"]["Item"] for a in request["TransactItems"] if "Put" in a]
        if (
            any(p.get("occurrence_id", {}).get("S") == lost for p in puts)
            and len(refused) < refusals
        ):
            refused.append(lost)
            error = client_error("TransactionCanceledException", "TransactWriteItems")
            error.response["CancellationReasons"] = [{"Code": "TransactionConflict"}] * 2
            raise error

    faults.before["transact_write_items"] = refuse
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN the reconciler checks the hour
    clock.now = at("11:05")
    [result] = Reconciler(racing).run(shards_of(aws, [sid]), at("10:00"), at("11:00"))
    # THEN the later instants stay deferred to the materializer through the second round
    assert set(result.deferred) == later
    assert result.report.deferred == len(later)
    if refusals == 1:
        # AND a refusal is retried: the gap fires
        assert result.fired == [lost]
        assert result.report.repair_conflicts == 0
        assert [o["state"] for o in stored(aws, since=at("10:15"), until=at("10:16"))] == [
            "SCHEDULED"
        ]
    else:
        # AND two refusals leave it to the next run, counted as a conflict (unsettled)
        assert result.fired == []
        assert result.report.repair_conflicts == 1
        assert not result.report.settled
        assert stored(aws, since=at("10:15"), until=at("10:16")) == []
    assert len(refused) == refusals


def test_reconciler_catch_up_checks_the_other_shards_when_reading_ones_reports_fails(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    from botocore.exceptions import ClientError

    # GIVEN a scheduled run whose read of shard 0's earlier reports fails
    clock.now = at("12:05")
    reconciler = Reconciler(aws)
    read = reconciler.reports.in_windows

    def flaky(shard: int, windows: list[tuple[int, int]]) -> Any:
        if shard == 0:
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "Query")
        return read(shard, windows)

    monkeypatch.setattr(reconciler.reports, "in_windows", flaky)
    # WHEN it runs; THEN it fails, so that the caller retries ...
    with pytest.raises(ClientError):
        reconciler.catch_up([0, 1], at("12:05"))
    # ... having checked every window of shard 1 all the same
    windows = [(at("10:00") - k * 3600, at("11:00") - k * 3600) for k in range(CATCHUP_WINDOWS + 1)]
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)
    assert store.settled_windows(1, windows) == set(windows)


def test_reconciler_catch_up_fails_when_a_window_fails_and_time_runs_out_before_its_retry(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    from botocore.exceptions import ClientError

    # GIVEN a run whose check of its own hour fails once, after which it is out of time
    clock.now = at("12:05")
    late = [False]
    reconciler = Reconciler(aws, out_of_time=lambda: late[0])
    check = reconciler.run_shard
    own = (at("10:00"), at("11:00"))

    def flaky(shard: int, start: int, end: int) -> Any:
        if (start, end) == own:
            late[0] = True
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "Query")
        return check(shard, start, end)

    monkeypatch.setattr(reconciler, "run_shard", flaky)
    # WHEN it catches up; THEN it fails (the hour was not checked: the caller retries)
    with pytest.raises(ClientError):
        reconciler.catch_up([0], at("12:05"))


def test_read_reports_reads_the_window_asked_for(alice: Api, aws: Services, clock: Clock):
    # GIVEN a shard's reports of [10:00, 11:00) and of the two hours [10:00, 12:00)
    clock.now = at("12:05")
    reconcile(aws, at("10:00"), at("11:00"), shards=[0])
    reconcile(aws, at("10:00"), at("12:00"), shards=[0])
    # THEN each window reads its own report, an hour by default
    [hour] = read_reports(aws, at("10:00"))
    [two] = read_reports(aws, at("10:00"), at("12:00"), shards=[0])
    assert (hour.window_end, two.window_end) == (at("11:00"), at("12:00"))
    assert read_reports(aws, at("10:00"), at("12:00"), shards=[1]) == []


def test_reconciler_compresses_a_slow_catchup_pace_into_sqs_delay(aws: Services, clock: Clock):
    # GIVEN a tenant that catches up one occurrence a minute, and its */5 CATCHUP schedule
    # (limit 20) whose twelve instants of [10:00, 11:00) were all lost
    bootstrap("carol", "arn:aws:iam::111111111111:role/carol", catchup_per_minute=1)
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 20}
    sid = make(aws, "carol", spec=cron_spec("*/5 * * * *"), misfire=misfire)
    lost = set(range(at("10:00"), at("11:00"), 300))
    materialize_until(aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t in lost)
    # WHEN the reconciler repairs them two hours later
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN all twelve fire, paced 60 s apart (the tenant's pace: 11 x 60 s fits in SQS's
    # delay), the earliest first
    assert len(ids(results, "fired")) == 12
    made = sorted(
        (o["scheduled_for"], o["available_at"])
        for o in stored(aws, since=at("10:00"), until=at("11:00"))
    )
    assert [a for _, a in made] == [at("12:05") + 60 * k for k in range(12)]


def test_reconciler_compresses_a_pace_too_slow_for_sqs(aws: Services, clock: Clock):
    # GIVEN a tenant that catches up one occurrence a minute, and its */3 CATCHUP schedule
    # (limit 20) whose twenty instants of [10:00, 11:00) were all lost
    bootstrap("carol", "arn:aws:iam::111111111111:role/carol", catchup_per_minute=1)
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 20}
    sid = make(aws, "carol", spec=cron_spec("*/3 * * * *"), misfire=misfire)
    lost = set(range(at("10:00"), at("11:00"), 180))
    materialize_until(aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t in lost)
    # WHEN the reconciler repairs them
    clock.now = at("12:05")
    reconcile(aws, at("10:00"), at("11:00"))
    # THEN 19 x 60 s would pass SQS's 900 s of delay: the pace is compressed to 840 // 19
    made = sorted(o["available_at"] for o in stored(aws, since=at("10:00"), until=at("11:00")))
    assert made == [at("12:05") + 44 * k for k in range(20)]


def test_reconciler_repairs_a_single_late_catchup_gap(alice: Api, aws: Services, clock: Clock):
    # GIVEN a CATCHUP schedule with one lost instant, repaired late
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 3}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:15")
    )
    clock.now = at("12:05")
    # THEN it fires now (a pace needs two)
    assert ids(reconcile(aws, at("10:00"), at("11:00")), "fired") == {
        occurrence_id(sid, 1, at("10:15"))
    }


def every_minute_losing_150(aws: Services, clock: Clock) -> tuple[str, set[int]]:
    """An every-minute CATCHUP schedule (a week of lateness tolerance, limit 1,000) whose
    150 instants of [10:00, 12:30) the materializer dropped: more than one transaction."""
    clock.now = at("09:40")
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 7 * 86400, "catchup_limit": 1000}
    sid = make(aws, spec=cron_spec("* * * * *"), misfire=misfire)
    lost = set(range(at("10:00"), at("12:30"), 60))
    materialize_until(aws, clock, at("12:40"), shards_of(aws, [sid]), skip=lambda s, t: t in lost)
    return sid, lost


def test_reconciler_repairs_more_gaps_than_one_transaction_holds(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an every-minute schedule whose 150 instants of [10:00, 12:30) were all lost
    sid, lost = every_minute_losing_150(aws, clock)
    # WHEN the reconciler repairs the 150 minutes at once (99 puts per transaction)
    clock.now = at("12:45")
    [result] = reconcile(aws, at("10:00"), at("12:30"), shards=shards_of(aws, [sid]))
    # THEN every one is made once, none left as a conflict
    assert len(result.fired) == 150
    assert result.report.repair_conflicts == 0
    made = [o["scheduled_for"] for o in stored(aws, since=at("10:00"), until=at("12:30"))]
    assert sorted(made) == sorted(lost)


def test_reconciler_counts_every_refused_chunk_of_a_large_repair(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN 150 lost instants of an every-minute schedule, and every repair transaction refused
    sid, _ = every_minute_losing_150(aws, clock)
    faults = Faults(FaultPlan.none(), clock)

    def refuse(_: str, request: dict[str, Any]) -> None:
        if any("Put" in a for a in request["TransactItems"]):
            error = client_error("TransactionCanceledException", "TransactWriteItems")
            error.response["CancellationReasons"] = [{"Code": "TransactionConflict"}]
            raise error

    faults.before["transact_write_items"] = refuse
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN the reconciler repairs them
    clock.now = at("12:45")
    [result] = Reconciler(racing).run(shards_of(aws, [sid]), at("10:00"), at("12:30"))
    # THEN all 150 (in two chunks each round) are counted as conflicts for the next run
    assert result.report.repair_conflicts == 150
    assert result.fired == []


def test_reconciler_records_a_lone_superseded_gap_missed(alice: Api, aws: Services, clock: Clock):
    # GIVEN a */5 schedule whose 10:15 was lost, updated at 10:22: its only gap is version 1's
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:20"), shards, skip=lambda s, t: t == at("10:15"))
    clock.now = at("10:22")
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    materialize_until(aws, clock, at("11:10"), shards)
    # WHEN the reconciler repairs [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN that gap alone is recorded MISSED (the transaction checks only the version)
    assert ids(results, "recorded_missed") == {occurrence_id(sid, 1, at("10:15"))}
    assert not ids(results, "fired")


def test_reconcile_report_counts_every_schedule_and_keeps_the_first_examples_only():
    # GIVEN three schedules' outcomes, 25 UNEXPECTED findings in all (more than a report
    # keeps as examples)
    tally = _Tally()
    for n in range(3):
        findings = [(Finding.UNEXPECTED, f"occ_{n}_{i}") for i in range(10 if n < 2 else 5)]
        tally.add(_ScheduleOutcome(schedule_id=f"s{n}", versions={}, findings=findings))
    # THEN it counts three schedules and 25 findings, lists all 25, keeps the first 20
    assert tally.schedules == 3
    assert tally.counts[Finding.UNEXPECTED] == 25
    assert len(tally.of(Finding.UNEXPECTED.value)) == 25
    assert tally.examples[Finding.UNEXPECTED] == [f"occ_{n}_{i}" for n in (0, 1) for i in range(10)]


def test_reconciler_after_renames_keeps_the_run_version_and_finds_nothing_wrong(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a strict */5 cron and a flexible */10 one (a 300 s window), each renamed twice
    # while the materializer plans them (a rename makes a version and keeps its run version)
    clock.now = at("09:02")
    strict = make(aws, spec=cron_spec("*/5 * * * *"))
    flexible = make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300)
    shards = shards_of(aws, [strict, flexible])
    materialize_until(aws, clock, at("10:12"), shards)
    for name in ("first", "second"):
        for sid in (strict, flexible):
            version = alice.get(f"/v1/schedules/{sid}").body["schedule"]["version"]
            answer = patch(alice, sid, {"name": name}, version)
            assert answer.status == 200, answer.body
            assert answer.body["affected"] == []
            assert answer.body["materialized"] == []
        materialize_until(aws, clock, clock.now + 20 * 60, shards)
    materialize_until(aws, clock, at("11:10"), shards)
    # WHEN the reconciler checks the hours of the renames
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN each fire has one occurrence, of version 1, none canceled; nothing is missing,
    # unexpected or superseded, and nothing was repaired
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    assert [(o["schedule_version"], o["state"]) for o in window] == [(1, "SCHEDULED")] * 18
    assert len({(o["schedule_id"], o["scheduled_for"]) for o in window}) == 18
    for finding in (Finding.MISSING, Finding.UNEXPECTED, Finding.SUPERSEDED):
        assert total(results, finding) == 0, finding
    assert total(results, Finding.IN_FLIGHT) == 18
    assert not ids(results, "fired")
    # AND a later change of what runs supersedes the run version, from its change on
    answer = patch(alice, strict, {"payload": {"v": 2}}, 3)
    assert answer.status == 200, answer.body
    assert answer.body["schedule"]["run_version"] == 4
    assert {a["schedule_version"] for a in answer.body["affected"]} == {1}


def test_reconciler_a_flexible_fire_due_after_a_rename_is_still_required_and_repaired(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a flexible */10 cron (a 300 s window) the materializer plans minute by minute,
    # until one of its fires has passed its instant and is not due yet, planned already
    clock.now = at("09:52")
    sid = make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300)
    shards = shards_of(aws, [sid])
    lost = None
    while lost is None:
        assert clock.now < at("10:50"), "no fire of the hour is due a minute after its instant"
        materialize_until(aws, clock, clock.now, shards, every=60)
        lost = next(
            (
                o
                for o in stored(aws, since=at("10:00"), until=int(clock.now))
                if o["available_at"] > clock.now
            ),
            None,
        )
    # WHEN the schedule is renamed then, and that occurrence is lost
    answer = patch(alice, sid, {"name": "renamed"}, 1)
    assert answer.status == 200, answer.body
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(lost["occurrence_id"])),
    )
    materialize_until(aws, clock, at("11:10"), shards)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN the fire is still required of the run version the rename kept: found MISSING and
    # repaired under its own id, not taken for a superseded version's "may exist"
    assert total(results, Finding.MISSING) == 1
    assert ids(results, "fired") == {lost["occurrence_id"]}

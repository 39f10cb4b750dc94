"""The reconciler on moto: an independent recomputation finds exactly what is missing,
repairs it once under the misfire policy, follows versions and pauses, agrees with the
time contract across DST, and its Lambda validates events and emits metrics."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from reconciler import handler

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import OccurrenceStore, Window
from punctual.dal.reports import ReportStore, report_key
from punctual.dal.schedules import ScheduleVersion
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.errors import InvalidInput
from punctual.domain.ids import available_at, occurrence_id, shard_of
from punctual.domain.models import (
    CronSpec,
    Finding,
    Occurrence,
    OccurrenceState,
    ReconcileReport,
    ScheduleDefinition,
    ScheduleState,
)
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import (
    CATCHUP_WINDOWS,
    HISTORY_MARGIN,
    INDEX_SETTLED,
    Reconciler,
    ShardResult,
    _ScheduleOutcome,
    _Tally,
    expected_occurrences,
    fired_late,
    metric_values,
    read_reports,
)
from punctual.services import Services
from punctual.settings import Settings
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, client_error
from tests.instants import epoch
from tests.integration.conftest import Api, Clock, LambdaContextStub, bootstrap
from tests.integration.helpers import (
    cron_spec,
    current_item,
    make,
    patch,
    set_occurrence_state,
    table_items,
)

HOUR = 3600
DAY = "2026-11-19"  # after the fixtures' tenants exist (START is 2026-11-18T11:06:40Z)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Two shards, not eight: each test walks every minute of its hours on each shard its
    schedules land in (a moto update a minute), and two still cover its work across shards."""
    return settings.model_copy(update={"shard_count": 2})


def at(hhmm: str, day: str = DAY) -> int:
    return epoch(f"{day}T{hhmm}Z")


def shards_of(aws: Services, ids: Iterable[str]) -> list[int]:
    return sorted({shard_of(sid, aws.settings.shard_count) for sid in ids})


def materialize_until(
    aws: Services,
    clock: Clock,
    until: int,
    shards: list[int],
    *,
    every: int = 300,
    skip: Callable[[str, int], bool] | None = None,
) -> None:
    """The healthy materializer: a tick every ``every`` seconds on each shard up to ``until``."""
    while clock.now <= until:
        for shard in shards:
            Materializer(aws, f"m{clock.now}", skip=skip).run_shard(int(clock.now), shard)
        clock.advance(every)


def stored(aws: Services, *, since: int = 0, until: int = 2**40) -> list[dict[str, Any]]:
    """Every occurrence item (not attempts) scheduled in [since, until)."""
    items = [
        i
        for i in table_items(aws, aws.settings.occurrences_table)
        if i["sk"]["S"].startswith("OCC#")
    ]
    found = [
        {
            "occurrence_id": i["occurrence_id"]["S"],
            "schedule_id": i["schedule_id"]["S"],
            "schedule_version": int(i["schedule_version"]["N"]),
            "scheduled_for": int(i["scheduled_for"]["N"]),
            "available_at": int(i["available_at"]["N"]),
            "state": i["state"]["S"],
            "lane": i.get("lane", {}).get("S"),
        }
        for i in items
    ]
    return sorted(
        (o for o in found if since <= o["scheduled_for"] < until),
        key=lambda o: (o["scheduled_for"], o["schedule_id"]),
    )


def reconcile(
    aws: Services, start: int, end: int, *, repair: bool = True, shards: list[int] | None = None
) -> list[ShardResult]:
    every = list(range(aws.settings.shard_count)) if shards is None else shards
    return Reconciler(aws, repair=repair, workers=4).run(every, start, end)


def total(results: list[ShardResult], finding: Finding) -> int:
    return sum(r.report.counts[finding] for r in results)


def ids(results: list[ShardResult], name: str) -> set[str]:
    return {oid for r in results for oid in getattr(r, name)}


def plant(aws: Services, sid: str, version: int, instant: int, *, local: str = "") -> str:
    """Store an occurrence of ``version`` at ``instant`` that no planner made (SCHEDULED,
    showing the wall time ``local`` when given): its id."""
    oid = occurrence_id(sid, version, instant)
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item={
            **to_dynamo(occurrence_key(oid)),
            "occurrence_id": {"S": oid},
            **({"local": {"S": local}} if local else {}),
            "schedule_version": {"N": str(version)},
            "scheduled_for": {"N": str(instant)},
            "available_at": {"N": str(instant)},
            "tenant_id": {"S": "alice"},
            "target": {"S": "default"},
            "state": {"S": "SCHEDULED"},
        },
    )
    return oid


# --- a clean system --------------------------------------------------------------------


def test_reconciler_clean_run_reports_zero_missing_and_zero_unexpected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN cron (two zones), rate, flexible, one-shot and hourly-in-New-York schedules,
    # materialized by a healthy materializer through the window [10:00, 11:00)
    clock.now = at("08:50")
    schedules = [
        make(aws, spec=cron_spec("*/5 * * * *")),
        make(aws, spec=cron_spec("0,30 * * * *", "Europe/Berlin")),
        make(aws, spec={"kind": "rate", "expression": "rate(7 minutes)"}),
        make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300),
        make(aws, spec={"kind": "at", "at": f"{DAY}T10:20:00Z"}),
        make(aws, spec=cron_spec("@hourly", "America/New_York")),
    ]
    materialize_until(aws, clock, at("11:10"), shards_of(aws, schedules))
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    # AND workers finished some of them in various ways
    outcomes = ["SUCCEEDED"] * 5 + ["DEAD", "SKIPPED_OVERLAP", "CANCELED"]
    for occurrence, state in zip(window, outcomes, strict=False):
        set_occurrence_state(aws, occurrence["occurrence_id"], state)
    # WHEN the reconciler checks that hour at 12:05
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN every expected instant was found, by its state, and nothing else is stored
    # (*/5: 12, Berlin :00/:30: 2, rate(7 minutes) from 08:50: 9, flexible */10: 6,
    # the one-shot: 1, hourly: 1)
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    assert len(window) == 31
    assert total(results, Finding.SUCCEEDED) == 5
    assert total(results, Finding.DEAD) == 1
    assert total(results, Finding.SKIPPED_OVERLAP) == 1
    assert total(results, Finding.CANCELED) == 1
    assert total(results, Finding.IN_FLIGHT) == 31 - 8
    assert all(r.report.complete for r in results)
    assert not ids(results, "fired")


def _clean_ten_oclock_hour(aws: Services, clock: Clock, *, in_flight: int) -> None:
    """Reconcile [10:00, 11:00) at 12:05: ``in_flight`` occurrences in flight, nothing
    missing, no stray, nothing repaired."""
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    assert total(results, Finding.IN_FLIGHT) == in_flight
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    assert not ids(results, "fired")


def test_reconciler_finds_the_fires_on_the_first_and_last_second_of_its_window(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN one-shots at 10:00:00 and 10:59:59, and at 09:59:59 and 11:00:00 just outside
    # the window, fired by a healthy materializer
    clock.now = at("09:50")
    edges = [
        make(aws, spec={"kind": "at", "at": f"{DAY}T{hhmmss}Z"})
        for hhmmss in ("09:59:59", "10:00:00", "10:59:59", "11:00:00")
    ]
    materialize_until(aws, clock, at("11:05"), shards_of(aws, edges))
    assert len(stored(aws, since=at("10:00"), until=at("11:00"))) == 2
    # WHEN the reconciler checks [10:00, 11:00)
    # THEN the two inside are found where they are (in flight), neither missing nor a
    # stray, and nothing is repaired; the two outside are not this window's
    _clean_ten_oclock_hour(aws, clock, in_flight=2)


def test_reconciler_counts_a_run_now_by_its_state_owed_by_no_fire(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule fired by a healthy materializer through [10:00, 11:00), and a
    # run now at 10:17
    clock.now = at("09:50")
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    materialize_until(aws, clock, at("10:15"), shards_of(aws, [sid]))
    clock.now = at("10:17")
    manual = ControlPlane(aws).trigger("alice", sid, None).occurrence
    assert manual.scheduled_for == at("10:17")
    materialize_until(aws, clock, at("11:05"), shards_of(aws, [sid]))
    # WHEN the reconciler checks the hour
    # THEN the run now is counted by its state (in flight: 12 fires and it), neither a
    # stray nor a fire
    _clean_ten_oclock_hour(aws, clock, in_flight=13)


def test_reconciler_reads_no_occurrence_of_a_schedule_owning_no_fire_in_a_settled_hour(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a daily 03:00 and an hourly schedule, unchanged for more than an hour before
    # [10:00, 11:00), materialized through it
    clock.now = at("08:50")
    daily = make(aws, spec=cron_spec("0 3 * * *"))
    hourly = make(aws, spec=cron_spec("0 * * * *"))
    materialize_until(aws, clock, at("12:10"), shards_of(aws, [daily, hourly]))
    read: list[str] = []
    real = OccurrenceStore.window

    def spied(self: OccurrenceStore, schedule_id: str, **window: Any) -> Window:
        read.append(schedule_id)
        return real(self, schedule_id, **window)

    monkeypatch.setattr(OccurrenceStore, "window", spied)
    # WHEN the hourly run checks that hour at 12:05
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN only the hourly one's occurrences are read (a Query saved per schedule-hour with
    # nothing to find), and only it is counted as examined
    assert read == [hourly]
    assert sum(r.report.schedules for r in results) == 1
    assert total(results, Finding.IN_FLIGHT) == 1
    # WHEN an hour is checked sooner after it closed than the shard index is trusted to show
    # a run now made in it
    read.clear()
    clock.now = at("12:00") + INDEX_SETTLED - 1
    reconcile(aws, at("11:00"), at("12:00"))
    # THEN every schedule's occurrences are read; from INDEX_SETTLED on, only the hourly's
    assert sorted(read) == sorted([daily, hourly])
    read.clear()
    clock.now = at("12:00") + INDEX_SETTLED
    reconcile(aws, at("11:00"), at("12:00"))
    assert read == [hourly]


@pytest.mark.parametrize(("paused_at", "read"), [("09:00:00", False), ("09:00:01", True)])
def test_reconciler_reads_a_schedule_paused_after_its_history_margin_began(
    alice: Api, aws: Services, clock: Clock, paused_at: str, read: bool
):
    # GIVEN an hourly schedule paused an hour before [10:00, 11:00) (where the history margin
    # begins), or a second later
    clock.now = at("08:50")
    sid = make(aws, spec=cron_spec("0 * * * *"))
    clock.now = at(paused_at)
    ControlPlane(aws).pause("alice", sid)
    # WHEN the hourly run checks that hour at 12:05
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN one paused at the margin's start is dormant and not read (nothing of it can be
    # stored in the hour); one paused within the margin is read, as what an earlier version
    # planned may still trail into the window
    assert sum(r.report.schedules for r in results) == int(read)


def test_reconciler_reads_a_one_shot_completed_after_a_run_now_at_its_windows_first_second(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot at 08:30, made at 08:00 and not fired by 10:00 (the materializer
    # down), run now at 10:00:00, then fired late and completed as the materializer comes back
    clock.now = at("08:00")
    sid = make(aws, spec={"kind": "at", "at": f"{DAY}T08:30:00Z"})
    clock.now = at("10:00")
    manual = ControlPlane(aws).trigger("alice", sid, None).occurrence
    assert manual.scheduled_for == at("10:00")
    materialize_until(aws, clock, at("10:05"), shards_of(aws, [sid]))
    assert current_item(aws, sid)["state"] == ScheduleState.COMPLETED
    # WHEN the reconciler checks [10:00, 11:00)
    # THEN it reads the schedule, though its rule ended before the history margin began (the
    # run now marks it for the window's first second): the run now is counted by its state
    _clean_ten_oclock_hour(aws, clock, in_flight=1)


def test_reconciler_reads_a_schedule_made_in_its_window_whatever_the_hosts_zone(
    alice: Api, aws: Services, clock: Clock, host_zone: Callable[[str], None]
):
    # GIVEN a */5 schedule made at 10:02, its 10:30 fire lost, on a host whose local zone is
    # five hours behind UTC
    clock.now = at("10:02")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    lost = occurrence_id(sid, 1, at("10:30"))
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:30")
    )
    host_zone("America/New_York")
    # WHEN the reconciler checks [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN it reads the schedule (the window's end is compared with creation instants in
    # UTC, not as 06:00 local) and finds the lost fire
    assert [i for r in results for i in r.report.examples.get(Finding.MISSING, [])] == [lost]


# --- injected gaps -------------------------------------------------------------------------


def test_reconciler_finds_exactly_the_deleted_and_skipped_occurrences_and_repairs_them_once(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN six */5 schedules whose misfire tolerance covers the repair (7 days)
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    schedules = [make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire) for _ in range(6)]
    # AND a materializer that silently drops three instants (the fault hook)
    dropped = {
        (schedules[0], at("10:15")),
        (schedules[3], at("10:40")),
        (schedules[5], at("10:00")),
    }
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, schedules), skip=lambda s, t: (s, t) in dropped
    )
    # AND N random occurrences of the window deleted afterwards
    window = stored(aws, since=at("10:00"), until=at("11:00"))
    victims = random.Random(9).sample(window, 7)
    for victim in victims:
        aws.dynamodb.delete_item(
            TableName=aws.settings.occurrences_table,
            Key=to_dynamo(occurrence_key(victim["occurrence_id"])),
        )
    lost = {v["occurrence_id"] for v in victims} | {
        occurrence_id(sid, 1, instant) for sid, instant in dropped
    }
    assert len(window) == 6 * 12 - len(dropped)
    # WHEN the reconciler runs at 12:05
    clock.now = at("12:05")
    first = reconcile(aws, at("10:00"), at("11:00"))
    # THEN exactly those are MISSING, and each was materialized again, to fire now
    assert ids(first, "missing") == lost
    assert total(first, Finding.MISSING) == len(lost)
    assert total(first, Finding.UNEXPECTED) == 0
    assert ids(first, "fired") == lost
    after = stored(aws, since=at("10:00"), until=at("11:00"))
    per_instant = Counter((o["schedule_id"], o["scheduled_for"]) for o in after)
    assert len(after) == 6 * 12
    assert set(per_instant.values()) == {1}
    repaired = [o for o in after if o["occurrence_id"] in lost]
    assert {o["state"] for o in repaired} == {"SCHEDULED"}
    assert {o["available_at"] for o in repaired} == {at("12:05")}
    # AND in the catch-up lane (relayed apart from fires due now); the others on time
    assert {o["lane"] for o in repaired} == {"CATCHUP"}
    assert {o["lane"] for o in after if o not in repaired} == {None}
    # AND a second run finds nothing missing and repairs nothing
    clock.advance(60)
    second = reconcile(aws, at("10:00"), at("11:00"))
    assert total(second, Finding.MISSING) == 0
    assert not ids(second, "fired")
    assert not ids(second, "recorded_missed")
    assert total(second, Finding.IN_FLIGHT) == 6 * 12
    assert len(stored(aws, since=at("10:00"), until=at("11:00"))) == 6 * 12


def test_reconciler_repair_that_loses_to_the_materializer_leaves_its_occurrence_alone(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule whose 10:15 instant the materializer dropped
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    lost = occurrence_id(sid, 1, at("10:15"))
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:15")
    )
    clock.now = at("12:05")
    # AND, just before the reconciler's repair commits, the same occurrence is written by
    # someone else (a materializer retry, another run): the repair's put is refused
    faults = Faults(FaultPlan.none(), clock)
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    raced: list[str] = []

    def materialized_first(_: str, request: dict[str, Any]) -> None:
        if raced:
            return
        put = next(a["Put"] for a in request["TransactItems"] if "Put" in a)
        aws.dynamodb.put_item(TableName=put["TableName"], Item=put["Item"])
        raced.append(put["Item"]["occurrence_id"]["S"])

    faults.before["transact_write_items"] = materialized_first
    # WHEN the reconciler checks the hour
    [result] = Reconciler(racing).run(shards_of(aws, [sid]), at("10:00"), at("11:00"))
    # THEN it found the gap, saw the occurrence exist when it read again after the refusal,
    # and neither wrote it twice nor counted a lost race: nothing is left open
    assert raced == [lost]
    assert result.missing == [lost]
    assert result.fired == []
    assert result.report.repair_conflicts == 0
    assert result.report.deferred == 0
    instants = [o["scheduled_for"] for o in stored(aws, since=at("10:15"), until=at("10:16"))]
    assert instants == [at("10:15")]


def test_reconciler_repairs_late_gaps_under_each_misfire_policy(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three */5 schedules with 5 minutes of lateness tolerance, one per policy, each
    # missing its 10:10, 10:15 and 10:20 occurrences
    clock.now = at("09:40")
    policies = {
        "SKIP": {"action": "SKIP", "max_lateness_seconds": 300},
        "FIRE_ONCE": {"action": "FIRE_ONCE", "max_lateness_seconds": 300},
        "CATCHUP": {"action": "CATCHUP", "max_lateness_seconds": 300, "catchup_limit": 2},
    }
    by_policy = {
        name: make(aws, spec=cron_spec("*/5 * * * *"), misfire=m) for name, m in policies.items()
    }
    gone = [at("10:10"), at("10:15"), at("10:20")]
    materialize_until(
        aws,
        clock,
        at("11:10"),
        shards_of(aws, by_policy.values()),
        skip=lambda s, t: t in gone,
    )
    # WHEN the reconciler runs two hours later (far beyond max_lateness)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN all nine are MISSING, and the policy decides: SKIP fires none, FIRE_ONCE the
    # latest, CATCHUP (limit 2) the latest two, paced; the rest are recorded MISSED
    assert total(results, Finding.MISSING) == 9
    fired = ids(results, "fired")
    recorded = ids(results, "recorded_missed")

    def occ(name: str, instant: int) -> str:
        return occurrence_id(by_policy[name], 1, instant)

    assert fired == {occ("FIRE_ONCE", gone[2]), occ("CATCHUP", gone[1]), occ("CATCHUP", gone[2])}
    assert recorded == {occ("SKIP", t) for t in gone} | {
        occ("FIRE_ONCE", gone[0]),
        occ("FIRE_ONCE", gone[1]),
        occ("CATCHUP", gone[0]),
    }
    states = {o["occurrence_id"]: o for o in stored(aws)}
    assert all(states[oid]["state"] == "MISSED" for oid in recorded)
    skipped = aws.occurrences.get(occ("SKIP", gone[0]))
    assert skipped is not None
    assert skipped.reason == "reconciler: missing; later than max_lateness (300 s) under SKIP"
    # AND a repaired occurrence is kept the retention (30 days) from its fire's instant
    fired_once = aws.occurrences.get(occ("FIRE_ONCE", gone[2]))
    assert fired_once is not None
    assert fired_once.expires_at == gone[2] + 30 * 86400
    # catch-up_per_minute defaults to 600: one second apart, the earlier one first
    assert states[occ("CATCHUP", gone[1])]["available_at"] == at("12:05")
    assert states[occ("CATCHUP", gone[2])]["available_at"] == at("12:05") + 1
    # AND the next run sees them as MISSED and in flight, with nothing left MISSING
    again = reconcile(aws, at("10:00"), at("11:00"))
    assert total(again, Finding.MISSING) == 0
    assert total(again, Finding.MISSED) == 6
    assert not ids(again, "fired") | ids(again, "recorded_missed")


@pytest.mark.parametrize(("after", "outcome"), [(0, "fired"), (1, "recorded_missed")])
def test_reconciler_judges_lateness_at_the_boundary_as_the_materializer_does(
    alice: Api, aws: Services, clock: Clock, after: int, outcome: str
):
    # GIVEN a */5 SKIP schedule with 5 minutes of lateness tolerance whose 10:10 was lost
    clock.now = at("09:40")
    misfire = {"action": "SKIP", "max_lateness_seconds": 300}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    lost = occurrence_id(sid, 1, at("10:10"))
    materialize_until(
        aws, clock, at("10:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:10")
    )
    # WHEN the reconciler repairs it exactly max_lateness after it was due (not late, as
    # the materializer's `available_at < now - max_lateness` says), or a second later
    clock.now = at("10:15") + after
    results = reconcile(aws, at("10:00"), at("10:15"))
    # THEN it fires on time, or, late, SKIP records it MISSED
    assert ids(results, outcome) == {lost}


def test_reconciler_defers_to_a_materializer_behind_then_reads_its_missed_summary(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 SKIP schedule whose materializer stopped at 09:55 (an outage)
    clock.now = at("09:40")
    sid = make(
        aws, spec=cron_spec("*/5 * * * *"), misfire={"action": "SKIP", "max_lateness_seconds": 60}
    )
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("09:55"), shards)
    # WHEN the reconciler checks [10:00, 11:00) during the outage
    clock.now = at("11:30")
    during = reconcile(aws, at("10:00"), at("11:00"))
    # THEN all twelve are MISSING but left to the materializer, whose cursor is before them
    # (a put of its own ids ahead of it would stall its shard)
    assert total(during, Finding.MISSING) == 12
    assert len(ids(during, "deferred")) == 12
    assert not ids(during, "fired") | ids(during, "recorded_missed")
    assert stored(aws, since=at("10:00"), until=at("11:00")) == []
    # WHEN the materializer recovers and applies SKIP, and the reconciler runs again
    materialize_until(aws, clock, at("11:31"), shards)
    after = reconcile(aws, at("10:00"), at("11:00"))
    # THEN the twelve are MISSED by policy (the summary on the schedule), none MISSING
    assert total(after, Finding.MISSED) == 12
    assert total(after, Finding.MISSING) == 0
    assert stored(aws, since=at("10:00"), until=at("11:00")) == []


def fire_once_until_outage(aws: Services, clock: Clock) -> tuple[str, list[int]]:
    """A */5 FIRE_ONCE schedule (60 s of lateness tolerance) made at 09:40 and materialized
    up to 09:55, where an outage begins. The schedule and its shards."""
    clock.now = at("09:40")
    sid = make(
        aws,
        spec=cron_spec("*/5 * * * *"),
        misfire={"action": "FIRE_ONCE", "max_lateness_seconds": 60},
    )
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("09:55"), shards)
    return sid, shards


def forget_missed_episodes(aws: Services, schedule_id: str) -> None:
    """Drop the schedule's MISSED episodes (only the latest few are kept)."""
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo(current_key(schedule_id)),
        UpdateExpression="SET missed_ranges = :none",
        ExpressionAttributeValues={":none": {"L": []}},
    )


def fire_once_outage(aws: Services, clock: Clock, recovery: str) -> tuple[str, int]:
    """A */5 FIRE_ONCE schedule through an outage from 09:55 to ``recovery``: the
    materializer fired the latest late instant (receivable at the recovery) and skipped the
    rest. The schedule, and that instant."""
    sid, shards = fire_once_until_outage(aws, clock)
    clock.now = at(recovery)
    materialize_until(aws, clock, at(recovery) + 60, shards)
    [late] = [o for o in stored(aws, until=at(recovery)) if o["available_at"] == at(recovery)]
    return sid, late["scheduled_for"]


def test_reconciler_recognizes_a_fire_once_outage_after_the_version_changed(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 FIRE_ONCE schedule through an outage from 09:55 to 11:30: the materializer
    # fires the latest late instant (11:25) and skips the rest
    sid, late = fire_once_outage(aws, clock, "11:30")
    assert late == at("11:25")
    # AND then an update (a new version: the schedule's MISSED summary starts afresh)
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    # WHEN the reconciler checks [10:00, 11:00)
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN the twelve gaps before the late-fired occurrence are MISSED by the policy
    assert total(results, Finding.MISSED) == 12
    assert total(results, Finding.MISSING) == 0


@pytest.mark.parametrize(("recovery", "follower"), [("11:30", "11:25"), ("11:04", "11:00")])
def test_reconciler_finds_the_late_fired_follower_past_the_window_when_no_episode_is_kept(
    alice: Api, aws: Services, clock: Clock, recovery: str, follower: str
):
    # GIVEN a */5 FIRE_ONCE schedule through an outage from 09:55 to the recovery: the
    # materializer fired the latest late instant (after the window below, or exactly at its
    # end) and skipped the rest
    sid, late = fire_once_outage(aws, clock, recovery)
    assert late == at(follower)
    before = stored(aws, since=at("10:00"), until=at("11:00"))
    # AND its MISSED episode no longer on the schedule (only the latest few are kept)
    forget_missed_episodes(aws, sid)
    # WHEN the reconciler checks (and may repair) [10:00, 11:00)
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN the twelve gaps are MISSED by the policy, told by the late-fired occurrence read
    # past the window: none is taken for MISSING, and none is fired by a repair
    assert total(results, Finding.MISSED) == 12
    assert total(results, Finding.MISSING) == 0
    assert stored(aws, since=at("10:00"), until=at("11:00")) == before


def test_reconciler_finds_the_late_fired_follower_inside_the_window_when_no_episode_is_kept(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 FIRE_ONCE schedule through an outage from 09:55 to 10:32: the materializer
    # fired 10:30 late and skipped 10:00 to 10:25, then went on as usual but lost 10:45
    sid, late = fire_once_outage(aws, clock, "10:32")
    assert late == at("10:30")
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("11:05"), shards, skip=lambda s, t: t == at("10:45"))
    # AND its MISSED episode no longer on the schedule
    forget_missed_episodes(aws, sid)
    # WHEN the reconciler checks [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN the six gaps before 10:30 are MISSED by the policy, told by that late fire in the
    # window (not by the on-time 11:00 after it); 10:45, whose follower (10:50) fired on
    # time, is MISSING (an earlier late fire says nothing of it)
    assert total(results, Finding.MISSED) == 6
    assert ids(results, "missing") == {occurrence_id(sid, 1, at("10:45"))}


@pytest.mark.parametrize("inside", [True, False])
def test_reconciler_takes_no_run_now_for_the_policys_late_fire(
    alice: Api, aws: Services, clock: Clock, inside: bool
):
    # GIVEN an hourly schedule with a minute's flexible window, materialized to 09:55 and
    # then the materializer down (10:00 and 11:00 never made), and a run now at 10:20 or,
    # past the window, at 11:20 (receivable at its instant: never its jittered one)
    clock.now = at("09:40")
    sid = make(
        aws,
        spec=cron_spec("0 * * * *"),
        flexible_window_seconds=60,
        misfire={"action": "FIRE_ONCE", "max_lateness_seconds": 7200},
    )
    materialize_until(aws, clock, at("09:55"), shards_of(aws, [sid]))
    clock.now = at("10:20" if inside else "11:20")
    ran = ControlPlane(aws).trigger("alice", sid, "key").occurrence
    assert ran.available_at == ran.scheduled_for
    # WHEN the reconciler checks [10:00, 11:00)
    clock.now = at("11:30")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN 10:00 is MISSING (a loss to repair), not MISSED by a misfire policy: a run now is
    # not a fire the policy released late, whatever its instant says
    assert ids(results, "missing") == {occurrence_id(sid, 1, at("10:00"))}
    assert total(results, Finding.MISSED) == 0


def test_reconciler_reads_the_follower_trace_for_every_gap_after_one_an_episode_covers(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 FIRE_ONCE schedule through two outages: 09:55 to 10:12 (10:10 fired late,
    # 10:00 and 10:05 skipped: its MISSED episode kept), and 10:37 to 10:52 (10:50 fired
    # late, 10:45 skipped), with 10:40 materialized, then lost, right before the second
    sid, shards = fire_once_until_outage(aws, clock)
    clock.now = at("10:12")
    materialize_until(aws, clock, at("10:37"), shards, every=60)
    lost = occurrence_id(sid, 1, at("10:40"))
    assert lost in {o["occurrence_id"] for o in stored(aws)}
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(lost))
    )
    clock.now = at("10:52")
    materialize_until(aws, clock, at("11:05"), shards)
    # AND only the first outage's episode on the schedule (the second's trimmed)
    item = current_item(aws, sid)
    assert len(item["missed_ranges"]) == 2
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo(current_key(sid)),
        UpdateExpression="REMOVE missed_ranges[1]",
    )
    # WHEN the reconciler checks [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN the first outage's gaps are MISSED by its episode, and 10:40 and 10:45 by the
    # late-fired 10:50 after them (the lost 10:40 cannot be told from a skipped one): a gap
    # the episode covers does not end the reading of the ones after it
    assert total(results, Finding.MISSED) == 4
    assert total(results, Finding.MISSING) == 0


# --- versions --------------------------------------------------------------------------


def test_reconciler_expected_sets_follow_updates_zone_changes_and_pauses(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */10 UTC schedule (v1) from 09:00, updated at 10:17:30 to */20 in Asia/Kolkata
    # (v2: UTC :10, :30, :50), paused at 10:33 (v3) and resumed at 10:45:20 (v4), with the
    # materializer ticking every minute throughout
    plane = ControlPlane(aws)
    clock.now = at("09:00")
    sid = make(aws, spec=cron_spec("*/10 * * * *"))
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:17"), shards, every=60)
    clock.now = at("10:17") + 30
    plane.update(
        "alice", sid, if_match=1, changes={"spec": cron_spec("*/20 * * * *", "Asia/Kolkata")}
    )
    clock.now = at("10:18")
    materialize_until(aws, clock, at("10:32"), shards, every=60)
    clock.now = at("10:33")
    plane.pause("alice", sid)
    clock.now = at("10:34")
    materialize_until(aws, clock, at("10:45"), shards, every=60)
    clock.now = at("10:45") + 20
    plane.resume("alice", sid)
    clock.now = at("10:46")
    materialize_until(aws, clock, at("11:10"), shards, every=60)
    # WHEN the expected set is recomputed from the version history
    versions = aws.schedules.versions_since(sid, at("10:00") - HISTORY_MARGIN)
    assert [v.schedule.version for v in versions] == [1, 2, 3, 4]
    horizon = aws.settings.planned_horizon_seconds + 60
    expected = expected_occurrences(versions, at("10:00"), at("11:00"), horizon=horizon)
    # THEN each version owns what was due while it applied; v1's 10:20, planned ahead by
    # the 10:17 tick, may exist (superseded); the paused version owns nothing
    required = {(e.version, e.scheduled_for) for e in expected if e.required}
    optional = {(e.version, e.scheduled_for) for e in expected if not e.required}
    assert required == {(1, at("10:00")), (1, at("10:10")), (2, at("10:30")), (4, at("10:50"))}
    assert (1, at("10:20")) in optional
    assert all(version != 3 for version, _ in required | optional)
    # AND the reconciler agrees with what is stored: v1's 10:20 was canceled by the update
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    assert total(results, Finding.SUPERSEDED) == 1
    superseded = next(
        o for o in stored(aws) if o["occurrence_id"] == occurrence_id(sid, 1, at("10:20"))
    )
    assert superseded["state"] == "CANCELED"
    # AND, with no relay running here, each change canceled the older versions' unsent
    # occurrences (v1's 10:00 and 10:10, v2's 10:30): they are owned, and CANCELED
    assert total(results, Finding.CANCELED) == 3
    assert total(results, Finding.IN_FLIGHT) == 1


def test_reconciler_agrees_with_the_planner_on_an_updated_flexible_schedule_and_repairs_its_gap(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a flexible */10 schedule (a 300 s window, a week of lateness tolerance) made at
    # 09:40 and updated at 09:45:30 (version 2), materialized every minute to 11:10 by a
    # materializer that silently drops version 2's 10:20
    clock.now = at("09:40")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300, misfire=misfire)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("09:45"), shards, every=60)
    clock.now = at("09:45") + 30
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    clock.now = at("09:46")
    materialize_until(aws, clock, at("11:10"), shards, every=60, skip=lambda s, t: t == at("10:20"))
    lost = occurrence_id(sid, 2, at("10:20"))
    # WHEN the reconciler recomputes [10:00, 11:00) from the history
    versions = aws.schedules.versions_since(sid, at("10:00") - HISTORY_MARGIN)
    horizon = aws.settings.planned_horizon_seconds + 60
    expected = expected_occurrences(versions, at("10:00"), at("11:00"), horizon=horizon)
    made = {
        o["occurrence_id"]: o["available_at"]
        for o in stored(aws, since=at("10:00"), until=at("11:00"))
    }
    # THEN it expects version 2's fires receivable where the planner put them: each one's
    # jitter is that of its own id, the version's (a flexible fire is due at
    # scheduled_for + jitter(id), so the id of another version gives another instant)
    jittered = {
        occurrence_id(sid, 2, t): available_at(occurrence_id(sid, 2, t), t, 300)
        for t in range(at("10:00"), at("11:00"), 600)
    }
    assert {e.occurrence_id: e.available_at for e in expected} == jittered
    assert made == {oid: due for oid, due in jittered.items() if oid != lost}
    assert len(set(jittered.values()) - set(range(at("10:00"), at("11:00"), 600))) > 1
    # AND the lost fire is MISSING (no other of the version looks fired late, so nothing
    # says a misfire policy left it) and repaired; nothing else is flagged
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"))
    assert ids(results, "missing") == {lost}
    assert ids(results, "fired") == {lost}
    assert total(results, Finding.UNEXPECTED) == 0
    assert total(results, Finding.MISSED) == 0
    assert lost in {o["occurrence_id"] for o in stored(aws, since=at("10:20"), until=at("10:21"))}


@pytest.mark.parametrize(
    ("changed_at", "finding"),
    [("10:10:00", Finding.SUPERSEDED), ("10:09:59", Finding.UNEXPECTED)],
)
def test_reconciler_expects_a_superseded_fire_only_as_far_past_the_change_as_it_was_planned(
    alice: Api, aws: Services, clock: Clock, changed_at: str, finding: Finding
):
    # GIVEN a minutely schedule changed at 10:10:00 (or a second earlier), materialized
    # throughout, and an occurrence of its first version at 10:18:00 (planned before the
    # change, or by no one)
    clock.now = at("09:50")
    sid = make(aws, spec=cron_spec("* * * * *"))
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:09"), shards, every=60)
    clock.now = at(changed_at)
    ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"n": 2}})
    materialize_until(aws, clock, at("11:05"), shards, every=60)
    trailing = plant(aws, sid, 1, at("10:18"))
    # WHEN the reconciler checks [10:00, 11:00)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN a version's fire is expected (SUPERSEDED) as far past its change as the API or
    # the materializer can have planned it: the planned horizon and three minutes more (8
    # here); a second beyond that, no planner made it: it is a stray (UNEXPECTED)
    assert aws.settings.planned_horizon_seconds + 180 == at("10:18") - at("10:10")
    assert trailing in set().union(*(r.report.examples.get(finding, []) for r in results))


def test_reconciler_reads_a_long_history_across_pages(alice: Api, aws: Services, clock: Clock):
    # GIVEN a */5 schedule created at 09:30 and updated ten times between 10:02 and 10:38
    # (more versions than one history page holds), materialized every minute throughout
    plane = ControlPlane(aws)
    clock.now = at("09:30")
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    shards = shards_of(aws, [sid])
    for number in range(1, 11):
        materialize_until(aws, clock, at("10:00") + number * 240 - 120, shards, every=60)
        clock.now = at("10:00") + number * 240 - 118
        plane.update("alice", sid, if_match=number, changes={"payload": {"n": number}})
    materialize_until(aws, clock, at("11:10"), shards, every=60)
    # WHEN the history is read and the hour reconciled
    history = aws.schedules.versions_since(sid, at("10:00") - HISTORY_MARGIN)
    clock.now = at("12:05")
    results = reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN every version is there, in order, and every instant of the hour has exactly one
    # owner: nothing MISSING, nothing UNEXPECTED; what the updates overtook is SUPERSEDED
    assert [v.schedule.version for v in history] == list(range(1, 12))
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    owned = sum(total(results, f) for f in Finding if f is not Finding.SUPERSEDED)
    assert owned == 12
    assert total(results, Finding.SUPERSEDED) >= 1


def test_reconciler_expected_occurrences_is_pure_over_a_history(alice: Api, aws: Services):
    # GIVEN a history written by hand: v1 */15 UTC from 09:58; v2 the same rule, changed at
    # exactly 10:15, a fire instant; v3 PAUSED at 10:31; v4 */5 in Asia/Kathmandu (UTC+05:45)
    # with a 900 s flexible window from 10:40
    base = (
        ControlPlane(aws)
        .create(
            "alice",
            ScheduleDefinition.model_validate(
                {"target": "default", "spec": cron_spec("*/15 * * * *")}
            ),
        )
        .schedule
    )

    def version(number: int, start: str, **changes: Any) -> ScheduleVersion:
        return ScheduleVersion(base.model_copy(update={"version": number, **changes}), at(start))

    history = [
        version(1, "09:58"),
        version(2, "10:15"),
        version(3, "10:31", state=ScheduleState.PAUSED),
        version(
            4,
            "10:40",
            spec=CronSpec(expression="*/5 * * * *", timezone="Asia/Kathmandu"),
            flexible_window_seconds=900,
        ),
    ]
    # WHEN the expected set of [10:00, 11:00) is computed with a 960 s planning horizon
    found = expected_occurrences(history, at("10:00"), at("11:00"), horizon=960)
    # THEN the fire at the change instant belongs to the old version; a later version owns
    # only fires strictly after its change; fires due after a change but within the horizon
    # may exist (False); the paused version owns nothing
    assert [(e.version, e.scheduled_for, e.required) for e in found] == [
        (1, at("10:00"), True),
        (1, at("10:15"), True),
        (1, at("10:30"), False),
        (2, at("10:30"), True),
        (2, at("10:45"), False),
        (4, at("10:45"), True),
        (4, at("10:50"), True),
        (4, at("10:55"), True),
    ]
    # AND ids and available_at are the deterministic ones (jittered for the flexible v4)
    for e in found:
        assert e.occurrence_id == occurrence_id(base.schedule_id, e.version, e.scheduled_for)
        window = 900 if e.version == 4 else 0
        assert e.available_at == available_at(e.occurrence_id, e.scheduled_for, window)


# --- DST ----------------------------------------------------------------------------------

NEW_YORK = "America/New_York"
SPRING = "2026-03-08"  # 02:00 EST -> 03:00 EDT at 07:00Z
FALL = "2026-11-01"  # 02:00 EDT -> 01:00 EST at 06:00Z
DST_CASES = {
    SPRING: {
        "30 1 * * *": ["06:30"],
        "30 2 * * *": [],  # 02:30 does not exist that day
        "*/30 * * * *": [
            "04:00",
            "04:30",
            "05:00",
            "05:30",
            "06:00",
            "06:30",
            "07:00",
            "07:30",
            "08:00",
            "08:30",
        ],
    },
    FALL: {
        "30 1 * * *": ["05:30"],  # once, at the earlier (EDT) 01:30
        "30 2 * * *": ["07:30"],
        # the repeated 01:00-01:59 (06:00Z-06:59Z) fires nothing the second time
        "*/30 * * * *": ["04:00", "04:30", "05:00", "05:30", "07:00", "07:30", "08:00", "08:30"],
    },
}
# What an engine that ignored the contract would have stored: a second 01:30 on the
# fall-back night, and the nonexistent 02:30 shifted to 03:30 EDT on the spring night.
NAIVE = {FALL: ("30 1 * * *", "06:30"), SPRING: ("30 2 * * *", "07:30")}


@pytest.mark.parametrize("day", [SPRING, FALL])
def test_reconciler_agrees_with_the_time_contract_on_dst_nights(
    alice: Api, aws: Services, clock: Clock, day: str
):
    # GIVEN '30 1 * * *', '30 2 * * *' and '*/30 * * * *' in New York, created the evening
    # before and materialized through the night
    clock.now = at("03:30", day)
    schedules = {expr: make(aws, spec=cron_spec(expr, NEW_YORK)) for expr in DST_CASES[day]}
    materialize_until(aws, clock, at("09:10", day), shards_of(aws, schedules.values()))
    # WHEN the reconciler checks [04:00Z, 09:00Z)
    clock.now = at("10:00", day)
    results = reconcile(aws, at("04:00", day), at("09:00", day))
    # THEN it expects exactly the contract's instants, all of which are stored
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.UNEXPECTED) == 0
    for expression, sid in schedules.items():
        found = sorted(
            o["scheduled_for"]
            for o in stored(aws, since=at("04:00", day), until=at("09:00", day))
            if o["schedule_id"] == sid
        )
        assert found == [at(t, day) for t in DST_CASES[day][expression]], expression
    assert total(results, Finding.IN_FLIGHT) == sum(len(v) for v in DST_CASES[day].values())
    # WHEN an occurrence a contract-blind engine would have made is stored (with the local
    # wall time it shows: on the fall-back night the second 01:30, which the rules in use
    # still show at its instant, so it is not a fire planned under older rules), and a real
    # one is lost
    expression, wrong = NAIVE[day]
    wall = datetime.fromtimestamp(at(wrong, day), ZoneInfo(NEW_YORK)).replace(tzinfo=None)
    bogus = plant(aws, schedules[expression], 1, at(wrong, day), local=wall.isoformat())
    real = occurrence_id(schedules["*/30 * * * *"], 1, at("05:30", day))
    aws.dynamodb.delete_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(real)),
    )
    again = reconcile(aws, at("04:00", day), at("09:00", day), repair=False)
    # THEN the stray one is UNEXPECTED and the lost one MISSING, nothing else
    assert ids(again, "unexpected") == {bogus}
    assert ids(again, "missing") == {real}


ADELAIDE = "Australia/Adelaide"
ADELAIDE_FALL = "2026-04-04"  # 03:00 ACDT -> 02:00 ACST at 16:30Z: 02:00-02:59 twice
# Each schedule's fires in [16:00Z, 17:00Z), the hour that ends at 02:30 of the repeated
# hour's second pass (ACST): only first-pass instants (the earlier, in ACDT) fire.
ADELAIDE_HOUR = {
    "*/15 * * * *": ["16:00", "16:15"],  # 02:30, 02:45 ACDT; 02:00-02:29 fired at 15:30Z on
    "0 * * * *": [],  # 02:00 ACDT fired at 15:30Z, 03:00 ACST is 17:30Z
    "30 * * * *": ["16:00"],
    "45 2 * * *": ["16:15"],
}


def test_reconciler_hour_ending_inside_adelaides_repeated_hour_finds_nothing_unexpected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN Adelaide schedules (a zone half an hour off UTC) made at 14:50Z on the night its
    # clocks go back, materialized through the night
    day = ADELAIDE_FALL
    clock.now = at("14:50", day)
    schedules = {expr: make(aws, spec=cron_spec(expr, ADELAIDE)) for expr in ADELAIDE_HOUR}
    materialize_until(aws, clock, at("17:10", day), shards_of(aws, schedules.values()))
    # WHEN the reconciler checks the hours around the change: [15:00Z, 16:00Z) ends at 02:30
    # ACDT, in the repeated hour's first pass, [16:00Z, 17:00Z) at 02:30 ACST, in its second
    clock.now = at("18:05", day)
    hours = {
        start: reconcile(aws, at(start, day), at(end, day), repair=False)
        for start, end in [("15:00", "16:00"), ("16:00", "17:00")]
    }
    # THEN no hour finds a stored fire it did not expect, nor one missing: the expected
    # fires of the hour ending in the repeated hour include those of its first pass
    for start, results in hours.items():
        assert total(results, Finding.UNEXPECTED) == 0, start
        assert total(results, Finding.MISSING) == 0, start
    for expression, sid in schedules.items():
        found = sorted(
            o["scheduled_for"]
            for o in stored(aws, since=at("16:00", day), until=at("17:00", day))
            if o["schedule_id"] == sid
        )
        assert found == [at(t, day) for t in ADELAIDE_HOUR[expression]], expression
    assert total(hours["16:00"], Finding.IN_FLIGHT) == 4


# --- reports, checks and the Lambda ------------------------------------------------------


def test_reconciler_stores_one_report_per_shard_and_window(alice: Api, aws: Services, clock: Clock):
    # GIVEN a */5 schedule with two instants of [10:00, 11:00) lost
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    lost = {at("10:05"), at("10:35")}
    materialize_until(aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t in lost)
    # WHEN the reconciler runs for every shard, with repair off
    clock.now = at("12:05")
    reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN every shard has one report for the window; the schedule's shard names the gaps
    reports = read_reports(aws, at("10:00"))
    assert [r.shard for r in reports] == list(range(aws.settings.shard_count))
    mine = reports[shard_of(sid, aws.settings.shard_count)]
    assert mine.counts[Finding.MISSING] == 2
    assert set(mine.examples[Finding.MISSING]) == {occurrence_id(sid, 1, t) for t in lost}
    assert mine.counts[Finding.IN_FLIGHT] == 10
    assert not mine.repair
    assert mine.repaired_fired == 0
    assert sum(r.schedules for r in reports) == 1
    # AND each is purged (the table's TTL) once the occurrences it speaks of are: the
    # retention after the window's end
    item = aws.dynamodb.get_item(
        TableName=aws.settings.leases_table,
        Key={"pk": {"S": report_key(at("10:00"), at("11:00"), mine.shard)}},
        ConsistentRead=True,
    )["Item"]
    assert int(item["purge_at"]["N"]) == at("11:00") + aws.settings.retention_days * 86400
    # AND a later run of the same window replaces it; another window has no report
    clock.advance(60)
    reconcile(aws, at("10:00"), at("11:00"))
    newer = read_reports(aws, at("10:00"), shards=[mine.shard])[0]
    assert newer.repaired_fired == 2
    assert read_reports(aws, at("11:00")) == []
    # AND a slower run that started before it cannot overwrite it when it finishes
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)
    assert not store.put(mine.model_copy(update={"run_at": newer.run_at - 1}), purge_at=0)
    assert read_reports(aws, at("10:00"), shards=[mine.shard]) == [newer]


LATER = {"field": "window_end", "reason": "must be later than window_start"}
CLOSED = {"field": "window_end", "reason": "only a closed, past window is reconciled"}
SPAN = {"field": "window_end", "reason": f"a window spans at most {24 * HOUR} s"}
SHARDS = {"field": "shards", "reason": "shards are 0..1"}  # (2 shards here)


@pytest.mark.parametrize(
    ("start", "end", "shards", "problems"),
    [
        (at("11:00"), at("10:00"), [0], [LATER]),
        (at("11:00"), at("11:00"), [0], [LATER]),  # an empty window
        (at("11:00"), at("13:00"), [0], [CLOSED]),  # not over at 12:05
        (at("11:00") - 24 * HOUR - 1, at("11:00"), [0], [SPAN]),
        (at("10:00"), at("11:00"), [2], [SHARDS]),
        (at("10:00"), at("11:00"), [-1], [SHARDS]),
        (at("11:00"), at("13:00"), [0, 2], [CLOSED, SHARDS]),
    ],
)
def test_reconciler_refuses_a_request_naming_each_field_and_reason(
    alice: Api,
    aws: Services,
    clock: Clock,
    start: int,
    end: int,
    shards: list[int],
    problems: list[dict[str, str]],
):
    # GIVEN 2 shards and the clock at 12:05
    clock.now = at("12:05")
    # WHEN a window that is inverted or empty, not over yet or over a day long, or a shard
    # that does not exist, is asked for
    with pytest.raises(InvalidInput) as refused:
        reconcile(aws, start, end, shards=shards)
    # THEN it is refused, each problem with its field and reason, all of them in one message
    assert refused.value.details["fields"] == problems
    assert refused.value.message == "the reconcile request is not valid: " + "; ".join(
        f"{p['field']}: {p['reason']}" for p in problems
    )


@pytest.mark.parametrize(
    ("start", "end", "shards"),
    [
        (at("00:00"), at("10:00"), [0, 1]),  # ten closed hours, every shard
        (at("12:05") - 24 * HOUR, at("12:05"), [1]),  # a whole day, ending now; the last shard
    ],
)
def test_reconciler_accepts_a_closed_window_of_at_most_a_day_over_known_shards(
    alice: Api, aws: Services, clock: Clock, start: int, end: int, shards: list[int]
):
    # GIVEN the clock at 12:05; WHEN closed windows up to a day long (the longest ending this
    # very second) are reconciled over known shards THEN each shard asked for reports
    clock.now = at("12:05")
    results = reconcile(aws, start, end, shards=shards)
    assert [r.report.shard for r in results] == shards


class FifteenMinutes(LambdaContextStub):
    function_name = "reconciler"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 900_000


def _emitted_metrics(output: str) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for line in output.splitlines():
        if '"_aws"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Punctual"
            assert directive["Dimensions"] == [["service"]]  # no per-tenant dimension
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                metrics[metric["Name"]] = sum(value) if isinstance(value, list) else value
    return metrics


# A refused event ends the invocation before any metric: Powertools warns about that.
@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_reconciler_handler_validates_the_event_and_emits_metrics(
    alice: Api, aws: Services, clock: Clock, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a */5 schedule with one instant of [10:00, 11:00) dropped by the materializer
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:25")
    )
    clock.now = at("12:05")
    handler.configure(aws)
    try:
        # WHEN the hourly run invokes the handler with the EventBridge time (12:03)
        answer = handler.lambda_handler(
            {"time": f"{DAY}T12:03:00Z", "shards": list(range(aws.settings.shard_count))},
            FifteenMinutes(),
        )
        # THEN it reconciled the hour that ended an hour ago, and the 48 before it (none had a
        # report yet), and emitted the counts: 09:40-09:55 and 10:00-10:55 in flight but the
        # one dropped, found missing and repaired
        windows = [(s["window_start"], s["window_end"]) for s in answer["shards"]]
        assert windows[-1] == (at("10:00"), at("11:00"))
        assert len(windows) == (CATCHUP_WINDOWS + 1) * aws.settings.shard_count
        emitted = _emitted_metrics(capsys.readouterr().out)
        assert emitted["ReconcileMissing"] == 1
        assert emitted["ReconcileRepaired"] == 1
        assert emitted["ReconcileRepairFired"] == 1
        assert emitted["ReconcileUnexpected"] == 0
        assert emitted["ReconcileInFlight"] == 11 + 4
        assert emitted["ReconcileIncomplete"] == 0
        # WHEN the next hourly run comes: its own hour is new, and the two hours whose
        # occurrences were still in flight (no worker here) are not settled: checked again
        clock.now = at("13:05")
        answer = handler.lambda_handler(
            {"time": f"{DAY}T13:03:00Z", "shards": list(range(aws.settings.shard_count))},
            FifteenMinutes(),
        )
        assert {(s["window_start"], s["window_end"]) for s in answer["shards"]} == {
            (at("09:00"), at("10:00")),
            (at("10:00"), at("11:00")),
            (at("11:00"), at("12:00")),
        }
        capsys.readouterr()
        # WHEN an operator re-runs that window explicitly
        handler.lambda_handler(
            {
                "time": f"{DAY}T12:06:00Z",
                "shards": [shard_of(sid, aws.settings.shard_count)],
                "window_start": f"{DAY}T10:00:00Z",
                "window_end": f"{DAY}T11:00:00Z",
            },
            FifteenMinutes(),
        )
        # THEN the repaired occurrence is in flight and nothing is missing any more
        emitted = _emitted_metrics(capsys.readouterr().out)
        assert emitted["ReconcileMissing"] == 0
        assert emitted["ReconcileInFlight"] == 12
        # WHEN events are malformed THEN each is refused with the field and the reason
        for bad, field in [
            ({"shards": [0]}, "time"),
            ({"time": "yesterday", "shards": [0]}, "time"),
            ({"time": f"{DAY}T12:03:00Z", "shards": []}, "shards"),
            (
                {"time": f"{DAY}T12:03:00Z", "shards": [0], "window_start": f"{DAY}T10:00:00Z"},
                "both",
            ),
            ({"time": f"{DAY}T12:03:00Z", "shards": [0], "dry": True}, "dry"),
        ]:
            with pytest.raises(InvalidInput, match="the reconciler event is not valid") as refused:
                handler.lambda_handler(bad, FifteenMinutes())
            assert field in str(refused.value)
    finally:
        handler.configure(None)


def test_fired_late_tells_a_policy_fire_from_a_jittered_one(alice: Api, aws: Services):
    # GIVEN a flexible occurrence at its deterministic instant, and the same one fired late
    oid = occurrence_id("sch_x", 1, 1000)
    due = available_at(oid, 1000, 600)
    normal = Occurrence(
        occurrence_id=oid,
        tenant_id="alice",
        schedule_id="sch_x",
        schedule_version=1,
        scheduled_for=1000,
        available_at=due,
        target="default",
        state=OccurrenceState.SCHEDULED,
    )
    late = normal.model_copy(update={"available_at": 5000})
    # THEN only the late one carries the trace of a misfire policy
    assert not fired_late(normal, 600)
    assert fired_late(late, 600)


def test_reconciler_handler_out_of_time_saves_incomplete_reports(
    alice: Api, aws: Services, clock: Clock, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a Lambda with less time left than the handler's safety margin
    clock.now = at("12:05")
    handler.configure(aws)
    try:
        # WHEN the hourly run starts
        answer = handler.lambda_handler(
            {"time": f"{DAY}T12:03:00Z", "shards": [0, 1]}, LambdaContextStub()
        )
    finally:
        handler.configure(None)
    # THEN it stops before examining anything, saves each shard's report as incomplete and
    # counts the incomplete shards, rather than being killed by the timeout
    assert [s["complete"] for s in answer["shards"]] == [False, False]
    assert [r.complete for r in read_reports(aws, at("10:00"), shards=[0, 1])] == [False, False]
    assert _emitted_metrics(capsys.readouterr().out)["ReconcileIncomplete"] == 2


def test_reconciler_reads_every_missed_episode_of_the_hour(alice: Api, aws: Services, clock: Clock):
    # GIVEN a */5 SKIP schedule with two outages in one hour: 10:05-10:30 and 10:40-10:55
    clock.now = at("09:40")
    sid = make(
        aws, spec=cron_spec("*/5 * * * *"), misfire={"action": "SKIP", "max_lateness_seconds": 60}
    )
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:05"), shards)
    clock.now = at("10:30")
    materialize_until(aws, clock, at("10:40"), shards)
    clock.now = at("10:55")
    materialize_until(aws, clock, at("11:31"), shards)
    # WHEN the reconciler checks [10:00, 11:00)
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN both episodes are MISSED by policy (two ranges on the schedule), none MISSING
    assert [r["count"] for r in current_item(aws, sid)["missed_ranges"]] == [4, 2]
    assert total(results, Finding.MISSED) == 6
    assert total(results, Finding.MISSING) == 0


def test_reconciler_catches_up_the_hours_an_outage_left_unchecked(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule whose occurrence at 10:25 was dropped, and a reconciler that was
    # down for the runs of 11:05 and 12:05 (the [09:00, 10:00) and [10:00, 11:00) hours)
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    materialize_until(
        aws, clock, at("12:00"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:25")
    )
    number = shard_of(sid, aws.settings.shard_count)
    reconciler = Reconciler(aws, workers=2)
    clock.now = at("10:05")
    reconciler.catch_up([number], int(clock.now))  # the last run before the outage
    # WHEN it is back for the 13:05 run
    clock.now = at("13:05")
    results = reconciler.catch_up([number], int(clock.now))
    # THEN it checks the three hours since its last complete run, and repairs the gap
    assert [(r.report.window_start, r.report.window_end) for r in results] == [
        (at("09:00"), at("10:00")),
        (at("10:00"), at("11:00")),
        (at("11:00"), at("12:00")),
    ]
    assert ids(results, "missing") == {occurrence_id(sid, 1, at("10:25"))}
    assert ids(results, "fired") == {occurrence_id(sid, 1, at("10:25"))}


def test_reconciler_catch_up_checks_every_other_window_when_one_fails(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a scheduled run at 12:05 with no report yet, whose check of [09:00, 10:00)
    # keeps failing (throttling that outlasted the client's retries), and of [08:00, 09:00)
    # fails once
    from botocore.exceptions import ClientError

    clock.now = at("12:05")
    reconciler = Reconciler(aws)
    check = reconciler.run_shard
    failing, once = (at("09:00"), at("10:00")), (at("08:00"), at("09:00"))
    tries: Counter[tuple[int, int]] = Counter()

    def flaky(shard: int, start: int, end: int) -> Any:
        tries[start, end] += 1
        if (start, end) == failing or ((start, end) == once and tries[once] == 1):
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "Query")
        return check(shard, start, end)

    monkeypatch.setattr(reconciler, "run_shard", flaky)
    # WHEN it runs; THEN it fails (so the caller retries) ...
    with pytest.raises(ClientError):
        reconciler.catch_up([0], at("12:05"))
    # ... having tried the failing window three times, the other one again, and checked
    # every other window, the older ones and its own hour included
    assert (tries[failing], tries[once]) == (3, 2)
    windows = [(at("10:00") - k * 3600, at("11:00") - k * 3600) for k in range(CATCHUP_WINDOWS + 1)]
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)
    assert store.settled_windows(0, windows) == set(windows) - {failing}
    # AND the next run checks the failed window and its own hour only
    clock.now = at("13:05")
    again = Reconciler(aws).catch_up([0], at("13:05"))
    assert [(r.report.window_start, r.report.window_end) for r in again] == [
        failing,
        (at("11:00"), at("12:00")),
    ]


def test_reconciler_reports_an_hour_that_leaves_its_horizon_still_open(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two shards' reports of the hour that drops out of the 12:05 run's horizon
    # (CATCHUP_WINDOWS hours before [09:00, 10:00)): shard 0's last check left it open
    # (it ran out of time), shard 1's settled it; and shard 0's next hour is open too
    clock.now = at("12:05")
    leaving = (at("10:00") - (CATCHUP_WINDOWS + 1) * HOUR, at("10:00") - CATCHUP_WINDOWS * HOUR)
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)

    def stored(shard: int, window: tuple[int, int], complete: bool) -> ReconcileReport:
        report = ReconcileReport.model_validate(
            {
                **dict(zip(("window_start", "window_end"), window, strict=True)),
                "shard": shard,
                "run_at": window[1] + HOUR,
                "complete": complete,
                "repair": True,
                "schedules": 0,
                "counts": {},
                "examples": {},
                "repaired_fired": 0,
                "repaired_missed": 0,
                "deferred": 0,
                "repair_conflicts": 0,
            }
        )
        assert store.put(report, purge_at=0)
        return report

    given_up = stored(0, leaving, complete=False)
    stored(1, leaving, complete=True)
    stored(0, (leaving[1], leaving[1] + HOUR), complete=False)
    # WHEN the scheduled run catches up
    reconciler = Reconciler(aws)
    results = reconciler.catch_up([0, 1], at("12:05"))
    # THEN it names shard 0's open hour as given up (the metric counts it), checks no
    # hour that old, and still checks the open hour inside its horizon
    assert reconciler.given_up == [given_up]
    assert metric_values(results, len(reconciler.given_up))["ReconcileGaveUp"] == 1
    checked = {(r.report.shard, r.report.window_start) for r in results}
    assert min(start for _, start in checked) == leaving[1]
    assert (0, leaving[1]) in checked


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

"""The reconciler against DynamoDB's eventual consistency (tests/faults.py: every
eventually consistent read and every index page served as of seconds ago), in the races its
reads must survive: a repair right after the materializer's catch-up of an outage, a check
right after a create or an update, a scheduled run asked again a moment after it ran."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import CATCHUP_WINDOWS, Reconciler, read_reports
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make, set_occurrence_state
from tests.integration.reconciler.helpers import (
    at,
    forget_missed_episodes,
    ids,
    materialize_until,
    shards_of,
    stored,
    total,
)

LAGGING = FaultPlan(stale=1.0, stale_seconds=5, index_lag=1.0, index_lag_seconds=5)


def lagging(aws: Services, clock: Clock, plan: FaultPlan = LAGGING) -> Services:
    """The same tables, every eventually consistent read (and index page) served as ``plan``
    says: by default 5 s behind."""
    return dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, Faults(plan, clock)))


def late_fires(aws: Services) -> list[int]:
    """The instants of the outage (09:56 to 11:03) fired, late, from 11:04 on."""
    return [
        o["scheduled_for"]
        for o in stored(aws, since=at("09:56"), until=at("11:04"))
        if o["available_at"] >= at("11:04")
    ]


def recovered_on_lagging_replicas(
    aws: Services, clock: Clock, misfire: dict[str, Any]
) -> tuple[str, list[int], Services]:
    """A */5 schedule made at 09:40 and materialized up to 09:55, then an outage, and the
    materializer's recovery at 11:04 (its late fires and MISSED episode) on replicas lagging
    5 s: the schedule, its shards, and those replicas."""
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("09:55"), shards)
    replicas = lagging(aws, clock)
    clock.now = at("11:04")
    for shard in shards:
        Materializer(replicas, "recovery").run_shard(int(clock.now), shard)
    return sid, shards, replicas


@pytest.mark.parametrize(
    "misfire",
    [
        {"action": "FIRE_ONCE", "max_lateness_seconds": 60},
        {"action": "CATCHUP", "catchup_limit": 1, "max_lateness_seconds": 60},
    ],
)
def test_repair_a_second_after_a_catch_up_adds_no_second_late_fire(
    alice: Api, aws: Services, clock: Clock, misfire: dict[str, Any]
):
    # GIVEN a */5 schedule (FIRE_ONCE, or CATCHUP of 1) made at 09:40 and materialized up to
    # 09:55, then an outage; at 11:04 the materializer recovers: it fires 11:00 late and
    # records 10:00 to 10:55 MISSED (an episode on the schedule), on a DynamoDB whose
    # replicas lag 5 s
    _, shards, replicas = recovered_on_lagging_replicas(aws, clock, misfire)
    assert late_fires(aws) == [at("11:00")]
    # WHEN the reconciler checks [10:00, 11:00) a second later, on the same lagging replicas
    # (the shard index and the occurrence reads show neither the episode nor the late fire)
    clock.now = at("11:04") + 1
    results = Reconciler(replicas, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN it repairs nothing: the twelve are MISSED by the policy, judged again from
    # consistent reads before any put; the outage has its one late fire, one id
    assert total(results, Finding.MISSED) == 12
    assert total(results, Finding.MISSING) == 0
    assert sum(r.report.repaired_fired for r in results) == 0
    assert late_fires(aws) == [at("11:00")]


def test_repair_a_second_after_a_catch_up_reads_its_late_fire_past_the_window_consistently(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 FIRE_ONCE schedule made at 09:40 and materialized up to 09:55, then an
    # outage; at 11:04 the materializer recovers (fires 11:00 late, skips 10:00 to 10:55),
    # and its MISSED episode is not on the schedule (only the latest few are kept): the
    # late fire past the window is the outage's only trace. Replicas lag 5 s.
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 60}
    sid, shards, replicas = recovered_on_lagging_replicas(aws, clock, misfire)
    forget_missed_episodes(aws, sid)
    # WHEN the reconciler checks [10:00, 11:00) a second later, on the same replicas (they
    # do not show the late fire yet)
    clock.now += 1
    results = Reconciler(replicas, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN the twelve are MISSED by the policy (the late fire read consistently before any
    # put), none MISSING, and the repair adds nothing: no fire, no MISSED record of its own
    assert total(results, Finding.MISSED) == 12
    assert total(results, Finding.MISSING) == 0
    assert sum(r.report.repaired_fired + r.report.repaired_missed for r in results) == 0
    assert stored(aws, since=at("10:00"), until=at("11:00")) == []
    assert late_fires(aws) == [at("11:00")]


def test_repair_a_second_after_a_catch_up_counts_its_late_fires_in_the_window_as_found(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 CATCHUP schedule (limit 3) made at 09:40 and materialized up to 09:55, then
    # an outage; at 11:04 the materializer recovers: it fires 10:50, 10:55 and 11:00 late
    # and records 10:00 to 10:45 MISSED, on a DynamoDB whose replicas lag 5 s
    misfire = {"action": "CATCHUP", "catchup_limit": 3, "max_lateness_seconds": 60}
    _, shards, replicas = recovered_on_lagging_replicas(aws, clock, misfire)
    assert late_fires(aws) == [at("10:50"), at("10:55"), at("11:00")]
    # WHEN the reconciler checks [10:00, 11:00) a second later, on the same lagging replicas
    # (they show neither the episode nor the two late fires inside the window)
    clock.now = at("11:04") + 1
    results = Reconciler(replicas, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN the two late fires are found (in flight), not reported MISSING, and the ten
    # before them are MISSED by the policy: nothing repaired, no fire added
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.IN_FLIGHT) == 2
    assert total(results, Finding.MISSED) == 10
    assert sum(r.report.repaired_fired + r.report.repaired_missed for r in results) == 0
    assert late_fires(aws) == [at("10:50"), at("10:55"), at("11:00")]


def test_repair_a_second_after_an_update_judges_the_gap_by_the_new_version(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule made at 08:50 whose 10:15 instant the materializer dropped, and
    # an update (version 2) at 12:05, on a DynamoDB whose replicas lag 5 s
    clock.now = at("08:50")
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 7 * 86400}
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire=misfire)
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("11:10"), shards, skip=lambda s, t: t == at("10:15"))
    replicas = lagging(aws, clock)
    clock.now = at("12:05")
    ControlPlane(replicas).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    # WHEN the reconciler repairs [10:00, 11:00) a second later, on the same replicas (the
    # shard index and the schedule's eventually consistent reads still show version 1)
    clock.now = at("12:05") + 1
    results = Reconciler(replicas, workers=1).run(shards, at("10:00"), at("11:00"))
    # THEN the gap is version 1's, superseded: recorded MISSED (no worker would run it),
    # never fired, and no repair is refused for a version that is gone
    gap = occurrence_id(sid, 1, at("10:15"))
    assert ids(results, "missing") == {gap}
    assert ids(results, "recorded_missed") == {gap}
    assert not ids(results, "fired")
    assert sum(r.report.repair_conflicts for r in results) == 0
    assert [o["state"] for o in stored(aws, since=at("10:15"), until=at("10:16"))] == ["MISSED"]


def test_check_a_moment_after_an_update_judges_its_fires_by_the_new_version(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule made at 08:50 whose fires workers ran through 10:55, updated at
    # 10:58:55 to fire every minute (the API makes its 10:59 fire itself), on a DynamoDB
    # whose replicas lag a second and whose index lags 10 s
    clock.now = at("08:50")
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:55"), shards)
    for done in stored(aws, until=at("10:56")):
        set_occurrence_state(aws, done["occurrence_id"], "SUCCEEDED")
    plan = FaultPlan(stale=1.0, stale_seconds=1, index_lag=1.0, index_lag_seconds=10)
    replicas = lagging(aws, clock, plan)
    clock.now = at("10:58") + 55
    changes = {"spec": cron_spec("* * * * *")}
    ControlPlane(replicas).update("alice", sid, if_match=1, changes=changes)
    made = occurrence_id(sid, 2, at("10:59"))
    assert made in {o["occurrence_id"] for o in stored(aws)}
    # WHEN the reconciler checks [10:00, 10:59:01) at once (the shard index still shows
    # version 1, the occurrences' reads the fire of version 2)
    clock.now = at("10:59") + 1
    results = Reconciler(replicas, workers=1, repair=False).run(
        shards, at("10:00"), at("10:59") + 1
    )
    # THEN version 2's fire is its own, in flight: not a stray of version 1
    assert total(results, Finding.UNEXPECTED) == 0
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.SUCCEEDED) == 12
    assert total(results, Finding.IN_FLIGHT) == 1


def test_check_a_moment_after_an_update_reads_the_history_that_supersedes_the_old_fire(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule made at 08:50 whose fires workers ran through 10:58, its
    # 10:59 planned, then updated at 10:58:55 to */5 (the update cancels 10:59), on a
    # DynamoDB whose table replicas lag 10 s and whose shard index has caught up
    clock.now = at("08:50")
    sid = make(aws, spec=cron_spec("* * * * *"))
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:58"), shards, every=60)
    old = occurrence_id(sid, 1, at("10:59"))
    assert old in {o["occurrence_id"] for o in stored(aws)}
    for done in stored(aws, until=at("10:59")):
        set_occurrence_state(aws, done["occurrence_id"], "SUCCEEDED")
    plan = FaultPlan(stale=1.0, stale_seconds=10, index_lag=1.0, index_lag_seconds=0)
    replicas = lagging(aws, clock, plan)
    clock.now = at("10:58") + 55
    ControlPlane(replicas).update(
        "alice", sid, if_match=1, changes={"spec": cron_spec("*/5 * * * *")}
    )
    # WHEN the reconciler checks [10:00, 10:59:01) at once (the index shows version 2, the
    # occurrence reads still show 10:59 SCHEDULED)
    clock.now = at("10:59") + 1
    results = Reconciler(replicas, workers=1).run(shards, at("10:00"), at("10:59") + 1)
    # THEN version 1's 10:59, due after version 2 took over, is SUPERSEDED (the history read
    # consistently names version 2): not one of version 1's fires still in flight
    assert total(results, Finding.SUPERSEDED) == 1
    assert total(results, Finding.IN_FLIGHT) == 0
    assert total(results, Finding.SUCCEEDED) == 59
    assert total(results, Finding.MISSING) + total(results, Finding.UNEXPECTED) == 0


def test_repair_a_moment_after_a_create_finds_the_fire_the_api_made(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a rate schedule created at 10:59:55 (it fires at once: the API makes that
    # occurrence itself), on a DynamoDB whose table replicas lag 10 s and whose shard index
    # has caught up
    plan = FaultPlan(stale=1.0, stale_seconds=10, index_lag=1.0, index_lag_seconds=0)
    replicas = lagging(aws, clock, plan)
    clock.now = at("10:59") + 55
    sid = make(replicas, spec={"kind": "rate", "expression": "rate(10 minutes)"})
    first = occurrence_id(sid, 1, at("10:59") + 55)
    assert [o["occurrence_id"] for o in stored(aws)] == [first]
    # WHEN the reconciler checks [10:00, 10:59:56) two seconds later, on the same replicas
    # (the index lists the schedule, the occurrence reads do not show its fire yet)
    clock.now = at("10:59") + 57
    results = Reconciler(replicas, workers=1).run(
        shards_of(aws, [sid]), at("10:00"), at("10:59") + 56
    )
    # THEN the fire is found (in flight), not reported MISSING, and nothing is repaired
    assert total(results, Finding.MISSING) == 0
    assert total(results, Finding.IN_FLIGHT) == 1
    assert not ids(results, "fired") | ids(results, "recorded_missed")
    assert [o["occurrence_id"] for o in stored(aws)] == [first]


def test_catch_up_asked_again_a_moment_later_checks_no_settled_hour_again(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a scheduled run at 12:05 that checked every hour of its horizon, all settled
    # (nothing there), its reports written through replicas that lag 5 s
    replicas = lagging(aws, clock)
    clock.now = at("12:05")
    first = Reconciler(replicas, workers=1).catch_up([0, 1], int(clock.now))
    assert len(first) == 2 * (CATCHUP_WINDOWS + 1)
    assert all(r.report.settled for r in first)
    # WHEN the same run is asked again a second later (a retry of a run whose answer was
    # lost), on the same replicas
    clock.now += 1
    again = Reconciler(replicas, workers=1).catch_up([0, 1], int(clock.now))
    # THEN it reads the reports just written and checks only the default hour again
    assert [(r.report.shard, r.report.window_start) for r in again] == [
        (0, at("10:00")),
        (1, at("10:00")),
    ]
    # AND an operator reading the reports a moment after finds them
    assert [r.shard for r in read_reports(replicas, at("10:00"))] == [0, 1]

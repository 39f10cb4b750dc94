"""The reconciler on moto with gaps injected. It finds exactly the deleted and skipped
occurrences and repairs each once, under every misfire policy, leaves an occurrence alone
when its repair loses to the materializer, judges lateness at the boundary as the
materializer does, and defers to a materializer that is behind. It recognizes a fire-once
outage and its late follower, with or without the missed episode that records it, and takes
no run now for the policy's late fire."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, current_item, make
from tests.integration.reconciler.helpers import (
    at,
    forget_missed_episodes,
    ids,
    materialize_until,
    reconcile,
    shards_of,
    stored,
    total,
)

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

"""The reconciler across a schedule's versions, on moto with the injected clock. Its expected
sets follow updates, zone changes and pauses, it agrees with the planner on an updated
flexible schedule, and it expects a superseded fire only as far past the change as it was
planned. It reads a long history across pages, and its expected occurrences are a pure
function of a history."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.schedules import ScheduleVersion
from punctual.domain.findings import Finding
from punctual.domain.ids import available_at, occurrence_id
from punctual.domain.schedule import ScheduleDefinition, ScheduleState
from punctual.domain.specs import CronSpec
from punctual.pipeline.ownership import expected_occurrences
from punctual.pipeline.reconciler import HISTORY_MARGIN
from punctual.services import Services
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.reconciler.helpers import (
    at,
    ids,
    materialize_until,
    plant,
    reconcile,
    shards_of,
    stored,
    total,
)

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

"""The reconciler's pure rules (punctual.pipeline.ownership): which schedules it may leave
unread (dormant), which gaps it leaves to the materializer (not_handled_yet), and the
metric totals it emits. A dormant rule too wide hides strays and missing fires; one too
narrow reads every dead schedule each hour. A deferral too wide leaves a lost fire
unrepaired; too narrow, the repair races the materializer's own misfire handling."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from punctual.dal.schedules import ScheduleVersion
from punctual.domain.findings import Finding, ReconcileReport
from punctual.domain.ids import available_at, occurrence_id
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.pipeline import ownership
from punctual.pipeline.ownership import Expected, expected_occurrences
from punctual.pipeline.reconciler import METRIC_NAMES, Reconciler, ShardResult, metric_values
from tests.instants import epoch

CREATED = datetime(2026, 11, 1, tzinfo=UTC)
SINCE = epoch("2026-11-19T09:00:00Z")  # the history margin's start before a window


def schedule(spec: dict[str, Any], **fields: Any) -> Schedule:
    return Schedule.model_validate(
        {
            "target": "default",
            "spec": spec,
            "tenant_id": "t_alice",
            "schedule_id": "sch_rules",
            "version": 1,
            "created_at": CREATED,
            "updated_at": CREATED,
            **fields,
        }
    )


HOURLY = {"kind": "cron", "expression": "0 * * * *", "timezone": "UTC"}


def one_shot(at: str) -> dict[str, Any]:
    return {"kind": "at", "at": at}


# --- ownership.dormant ----------------------------------------------------------------------------


@pytest.mark.parametrize("state", [ScheduleState.PAUSED, ScheduleState.CANCELED])
def test_a_schedule_stopped_by_the_margin_is_dormant_from_that_very_instant(state: ScheduleState):
    stopped = schedule(HOURLY, state=state)
    assert ownership.dormant(ScheduleVersion(stopped, effective_from=SINCE), SINCE)
    assert ownership.dormant(ScheduleVersion(stopped, effective_from=SINCE - 3600), SINCE)


@pytest.mark.parametrize("state", [ScheduleState.PAUSED, ScheduleState.CANCELED])
def test_a_schedule_stopped_after_the_margin_began_is_read(state: ScheduleState):
    # its version may have owned (or been planned with) fires inside the history margin
    stopped = schedule(HOURLY, state=state)
    assert not ownership.dormant(ScheduleVersion(stopped, effective_from=SINCE + 1), SINCE)


def test_an_active_schedule_is_read_even_in_an_hour_where_it_owns_no_fire():
    # (a stray, e.g. a nonexistent wall time fired anyway, is found only by reading it)
    daily = schedule({"kind": "cron", "expression": "0 3 * * *", "timezone": "UTC"})
    assert not ownership.dormant(ScheduleVersion(daily, effective_from=SINCE - 86400), SINCE)


def test_a_completed_schedule_is_dormant_once_its_last_fire_is_before_the_margin():
    done = schedule(one_shot("2026-11-19T08:30:00Z"), state=ScheduleState.COMPLETED)
    assert ownership.dormant(ScheduleVersion(done, effective_from=SINCE - 600), SINCE)


def test_a_completed_schedule_whose_last_fire_is_inside_the_margin_is_read():
    done = schedule(one_shot("2026-11-19T09:30:00Z"), state=ScheduleState.COMPLETED)
    assert not ownership.dormant(ScheduleVersion(done, effective_from=SINCE - 600), SINCE)


def test_an_active_schedule_with_no_fire_left_is_still_read():
    # ACTIVE until the materializer completes it: its last fire may still be in flight
    ending = schedule(one_shot("2026-11-19T08:30:00Z"))
    assert not ownership.dormant(ScheduleVersion(ending, effective_from=SINCE - 600), SINCE)


# --- _idle: a schedule owning no fire in the window, whose occurrences are not read ----------

START = SINCE + 3600  # the window [START, START + 1 h) whose history margin starts at SINCE
DAILY = {"kind": "cron", "expression": "0 3 * * *", "timezone": "UTC"}


def idle(version: ScheduleVersion, start: int = START) -> bool:
    return ownership.idle(version, start, start + 3600, start - 3600)


def test_a_schedule_unchanged_since_the_margin_with_no_run_now_is_idle():
    assert idle(ScheduleVersion(schedule(DAILY), effective_from=SINCE))


def test_a_schedule_changed_inside_the_margin_is_read():
    # an earlier version's fire may trail into the window (planned ahead, then superseded)
    assert not idle(ScheduleVersion(schedule(DAILY), effective_from=SINCE + 1))


@pytest.mark.parametrize(("mark", "read"), [(START - 1, False), (START, True), (START + 60, True)])
def test_a_run_now_for_the_window_or_later_makes_it_read(mark: int, read: bool):
    # (the mark is the latest run now's instant: one at START or after may lie in the window)
    version = ScheduleVersion(schedule(DAILY), effective_from=SINCE, manual_through=mark)
    assert idle(version) is not read


def test_a_schedule_planned_under_older_zone_rules_is_read():
    old = schedule(DAILY | {"timezone": "Europe/Berlin"}, tzdata_version="1999a")
    assert not idle(ScheduleVersion(old, effective_from=SINCE))


NEW_YORK_DAILY = {"kind": "cron", "expression": "30 2 * * *", "timezone": "America/New_York"}
SPRING_FORWARD = epoch("2026-03-08T07:00:00Z")  # 02:00 EST -> 03:00 EDT


@pytest.mark.parametrize(
    ("start", "read"),
    [
        (SPRING_FORWARD - 86400 - 3600, True),  # the window ends a day before the change
        (SPRING_FORWARD - 86400 - 3601, False),
        (SPRING_FORWARD + 86400 - 1, True),  # it begins just under a day after
        (SPRING_FORWARD + 86400, False),
    ],
)
def test_a_zone_changing_its_offset_within_a_day_of_the_window_makes_it_read(
    start: int, read: bool
):
    # (a planner's mistake at a transition puts a stray in an hour the schedule owns nothing
    # of: a nonexistent 02:30 fired at 03:30, say; only reading those hours finds it)
    version = ScheduleVersion(schedule(NEW_YORK_DAILY), effective_from=start - 7200)
    assert idle(version, start) is not read


def test_a_rate_or_utc_schedule_has_no_transition_to_read_around():
    rate = schedule({"kind": "rate", "expression": "rate(1 day)"})
    for spec_schedule in (rate, schedule(DAILY)):
        version = ScheduleVersion(spec_schedule, effective_from=SPRING_FORWARD - 7200 - 3600)
        assert idle(version, SPRING_FORWARD - 3600)


# --- ownership.not_handled_yet --------------------------------------------------------------------


def gap(scheduled_for: int, available: int, version: int = 1) -> Expected:
    return Expected("sch_rules", version, scheduled_for, f"occ_{scheduled_for}", available, True)


T = epoch("2026-11-19T10:00:00Z")


def cursor(**fields: Any) -> Schedule:
    return schedule(HOURLY, **fields)


def test_a_fire_due_after_the_planned_until_is_left_to_the_materializer():
    current = cursor(planned_until=T + 100, next_run_at=T + 60)
    assert ownership.not_handled_yet(current, gap(T + 60, T + 101))


def test_a_fire_due_exactly_at_planned_until_is_handled():
    current = cursor(planned_until=T + 100, next_run_at=T + 120)
    assert not ownership.not_handled_yet(current, gap(T + 60, T + 100))


def test_the_cursor_judges_by_due_time_not_by_fire_time_under_a_flexible_window():
    # GIVEN fires at T (jittered, due at T+250) and T+60 (due at T+70), planned up to T+100:
    # the fire at T+60 is handled, the one at T is not, so the cursor's next fire is T
    current = cursor(planned_until=T + 100, next_run_at=T)
    # THEN the handled later fire is not deferred, the unhandled earlier one is
    assert not ownership.not_handled_yet(current, gap(T + 60, T + 70))
    assert ownership.not_handled_yet(current, gap(T, T + 250))


def test_a_cursor_from_before_planned_until_defers_from_its_next_fire_on():
    current = cursor(planned_until=None, next_run_at=T + 60)
    assert ownership.not_handled_yet(current, gap(T + 60, T + 90))
    assert ownership.not_handled_yet(current, gap(T + 120, T + 120))
    assert not ownership.not_handled_yet(current, gap(T, T + 30))


def test_a_cursor_with_nothing_left_to_fire_defers_nothing():
    current = cursor(planned_until=T - 3600, next_run_at=None)
    assert not ownership.not_handled_yet(current, gap(T, T))


def test_a_superseded_versions_gap_is_never_left_to_the_materializer():
    # the materializer plans only the current version: it would never handle it
    current = cursor(version=2, planned_until=T - 3600, next_run_at=T - 60)
    assert not ownership.not_handled_yet(current, gap(T, T, version=1))


# --- metric_values ----------------------------------------------------------------------------


def result(shard: int, base: int, *, complete: bool = True) -> ShardResult:
    """A shard's report whose every count is distinct (base, base+1, ...)."""
    counts = {finding: base + index for index, finding in enumerate(Finding)}
    report = ReconcileReport(
        shard=shard,
        window_start=T,
        window_end=T + 3600,
        run_at=T + 7200,
        complete=complete,
        repair=True,
        schedules=base + 20,
        counts=counts,
        examples={},
        repaired_fired=base + 21,
        repaired_missed=base + 22,
        deferred=base + 23,
        repair_conflicts=base + 24,
        cursors_moved=base + 25,
        redriven=base + 26,
        replanned=base + 27,
        malformed=base + 28,
    )
    return ShardResult(report, [], [], [], [], [])


def test_metric_values_are_zero_for_no_results_and_report_the_given_up_hours():
    totals = metric_values([])
    assert set(totals.values()) == {0}
    assert set(totals) == {
        *METRIC_NAMES.values(),
        "ReconcileRepaired",
        "ReconcileRepairFired",
        "ReconcileRepairMissed",
        "ReconcileRepairDeferred",
        "ReconcileRepairConflicts",
        "ReconcileSchedules",
        "ReconcileIncomplete",
        "ReconcileCursorsMoved",
        "ReconcileRedriven",
        "ReconcileReplanned",
        "ReconcileGaveUp",
        "MalformedItems",
    }
    assert metric_values([], given_up=3)["ReconcileGaveUp"] == 3


def test_metric_values_sum_every_count_over_the_shards():
    first, second = result(0, 100), result(1, 1000, complete=False)
    totals = metric_values([first, second], given_up=2)
    for index, finding in enumerate(Finding):
        assert totals[METRIC_NAMES[finding]] == 100 + index + 1000 + index
    assert totals["ReconcileSchedules"] == 120 + 1020
    assert totals["ReconcileRepairFired"] == 121 + 1021
    assert totals["ReconcileRepairMissed"] == 122 + 1022
    assert totals["ReconcileRepaired"] == 121 + 122 + 1021 + 1022
    assert totals["ReconcileRepairDeferred"] == 123 + 1023
    assert totals["ReconcileRepairConflicts"] == 124 + 1024
    assert totals["ReconcileCursorsMoved"] == 125 + 1025
    assert totals["ReconcileRedriven"] == 126 + 1026
    assert totals["ReconcileReplanned"] == 127 + 1027
    assert totals["MalformedItems"] == 128 + 1028
    assert totals["ReconcileIncomplete"] == 1
    assert totals["ReconcileGaveUp"] == 2


# --- Reconciler._unread: dormant and idle together -------------------------------------------

CHECKER = SimpleNamespace(settings=SimpleNamespace(region="us-east-1"), horizon=1140)


@pytest.mark.parametrize("skip_idle", [True, False])
def test_a_run_now_made_before_its_schedule_completed_is_read(skip_idle: bool):
    # GIVEN a one-shot at 10:00Z run now at 11:30Z while still ACTIVE (its completion lagged
    # behind a slow materializer), then COMPLETED (no new version)
    start, end = epoch("2026-11-19T11:00:00Z"), epoch("2026-11-19T12:00:00Z")
    done = schedule(one_shot("2026-11-19T10:00:00Z"), state=ScheduleState.COMPLETED)
    created = int(CREATED.timestamp())
    marked = ScheduleVersion(done, created, manual_through=epoch("2026-11-19T11:30:00Z"))
    # THEN its hour is read (dormant, but for the run now); without the mark it is not
    assert Reconciler._unread(CHECKER, marked, start, end, skip_idle) is False  # type: ignore[arg-type]
    unmarked = ScheduleVersion(done, created)
    assert Reconciler._unread(CHECKER, unmarked, start, end, skip_idle) is True  # type: ignore[arg-type]


# --- expected_occurrences: which fires a version owns ----------------------------------------

MINUTELY = {"kind": "cron", "expression": "* * * * *", "timezone": "UTC"}


@pytest.mark.parametrize(("created", "first"), [(0, 0), (1, 60), (59, 60)])
def test_version_one_owns_the_fire_at_its_creation_instant_and_none_before(
    created: int, first: int
):
    # A schedule made at START + created owns the fires from that instant on: a rate
    # anchored there fires at once, and a fire a second before its creation is not its own.
    version = ScheduleVersion(schedule(MINUTELY), effective_from=START + created)
    fires = [
        e.scheduled_for for e in expected_occurrences([version], START, START + 180, horizon=0)
    ]
    assert fires == list(range(START + first, START + 180, 60))


def changed_at_start_plus_60(until: int, horizon: int) -> set[tuple[int, int, bool]]:
    """(version, fire, required) of a minutely schedule changed (version 2) at START + 60,
    expected in [START, until)."""
    first = ScheduleVersion(schedule(MINUTELY), effective_from=START - 3600)
    second = ScheduleVersion(schedule(MINUTELY, version=2), effective_from=START + 60)
    return {
        (e.version, e.scheduled_for, e.required)
        for e in expected_occurrences([first, second], START, until, horizon=horizon)
    }


def test_a_later_version_owns_only_the_fires_strictly_after_its_change():
    owned = changed_at_start_plus_60(START + 180, horizon=0)
    assert owned == {(1, START, True), (1, START + 60, True), (2, START + 120, True)}


def test_a_superseded_versions_fire_due_by_the_horizon_past_the_change_is_expected_not_required():
    # The predecessor's fires due within `horizon` of the change may have been planned:
    # expected (found: SUPERSEDED; absent: no gap), not required; later ones are not expected.
    owned = changed_at_start_plus_60(START + 240, horizon=60)
    assert (1, START + 120, False) in owned  # due exactly at the change + horizon
    assert not {(v, t) for v, t, _ in owned if v == 1 and t > START + 120}


def test_a_superseded_fire_jittered_past_the_horizon_does_not_hide_a_later_one_within_it():
    # Under a flexible window a fire's due time is its instant plus its id's jitter, so a
    # later fire can be due before an earlier one: each is judged on its own.
    successor = START + 30
    for n in range(200):
        sid = f"sch_rules_{n}"
        early, late = (
            available_at(occurrence_id(sid, 1, f), f, 300) for f in (START + 60, START + 120)
        )
        if early > late > successor:
            break
    else:
        pytest.fail("no schedule id with the jitters this case needs")
    flexible = schedule(MINUTELY, schedule_id=sid, flexible_window_seconds=300)
    first = ScheduleVersion(flexible, effective_from=START - 3600)
    second = ScheduleVersion(schedule(MINUTELY, schedule_id=sid, version=2), successor)
    owned = {
        (e.scheduled_for, e.required)
        for e in expected_occurrences([first, second], START, START + 180, horizon=late - successor)
        if e.version == 1
    }
    assert (START + 60, False) not in owned
    assert (START + 120, False) in owned


@pytest.mark.parametrize(
    ("ranges", "merged"),
    [
        ([], []),
        ([(5, 9), (1, 3)], [(1, 3), (5, 9)]),  # apart: each read, in order
        ([(1, 4), (4, 6)], [(1, 6)]),  # touching: one read
        ([(1, 8), (2, 3), (7, 12)], [(1, 12)]),  # inside and overlapping
        ([(-50, 3), (18, 90)], [(0, 3), (18, 20)]),  # clipped to [0, 20)
        ([(-9, -1), (25, 30), (6, 6)], []),  # outside, or empty
    ],
)
def test_backfill_ranges_are_read_clipped_and_joined(
    ranges: list[tuple[int, int]], merged: list[tuple[int, int]]
):
    # (A backfill's record names [from, to) of its fires; the reconciler reads each stretch
    # once, within what a backfill can make.)
    assert ownership.merged(ranges, 0, 20) == merged

"""punctual.domain.planning: the fires one step makes and the cursor it leaves, checked against the
schedule's fires counted one by one (what the materializer and the API write)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from punctual.domain.planning import (
    MAX_CATCHUP_SPREAD,
    Cursor,
    cursor_after,
    handled_until,
    new_occurrence,
    plan,
)
from punctual.domain.schedule import Schedule

CREATED = datetime(2026, 1, 1, 10, 7, 30, tzinfo=UTC)
START = int(CREATED.timestamp())


def _schedule(expression: str, window: int = 0, **extra: Any) -> Schedule:
    return Schedule.model_validate(
        {
            "spec": {"kind": "rate", "expression": expression},
            "target": "default",
            "flexible_window_seconds": window,
            "tenant_id": "t1",
            "schedule_id": "sch_planning",
            "version": 1,
            "created_at": CREATED,
            "updated_at": CREATED,
        }
        | extra
    )


def _minutely(window: int, *, tied: bool) -> Schedule:
    """A minutely schedule at :30 past, jittered over ``window`` seconds, two of whose fires
    in its first hour become available at one second, or none (found by trying ids: about
    one in two jittered over five minutes has such a tie)."""
    for n in range(1000):
        schedule = _schedule("rate(1 minute)", window, schedule_id=f"sch_planning{n}")
        seconds = _available(schedule, range(START, START + 3601, 60)).values()
        if (len(set(seconds)) < len(seconds)) == tied:
            return schedule
    raise AssertionError("no such id")


def _available(schedule: Schedule, fires: range) -> dict[int, int]:
    """Each fire's available_at, from the occurrence it makes."""
    return {f: new_occurrence(schedule, f, 86400).available_at for f in fires}


def _step(schedule: Schedule, planned_until: int | None, until: int, **kw: Any) -> Any:
    return plan(
        schedule, planned_until=planned_until, until=until, now=START, retention_seconds=86400, **kw
    )


def _walk(schedule: Schedule, until: int, limit: int) -> list[list[int]]:
    """The fires of each step up to ``until``, each going on from the cursor the last left."""
    steps: list[list[int]] = []
    handled = None
    while handled is None or handled < until:
        step = _step(schedule, handled, until, limit=limit)
        steps.append([o.scheduled_for for o in step.occurrences])
        handled = step.cursor.planned_until
        assert len(steps) < 1000
    return steps


def _made_once(schedule: Schedule, until: int, steps: list[list[int]]) -> None:
    """Every fire available by ``until`` made, none twice."""
    made = [f for step in steps for f in step]
    available = _available(schedule, range(START, until + 1, 60))
    assert sorted(made) == sorted(f for f, a in available.items() if a <= until)
    assert len(made) == len(set(made))


@pytest.mark.parametrize("window", [0, 300])
def test_a_step_cut_by_its_limit_goes_on_from_its_cursor_with_no_fire_twice_or_missed(
    window: int,
):
    # GIVEN a rate schedule firing every minute at :30 past, strict or jittered over five
    # minutes (its fires' seconds all distinct), planned an hour ahead at most three fires
    # a step: a cut step's cursor stops on a fire's own available second, and a jittered
    # fire before it is read again
    schedule = _minutely(window, tied=False)
    # WHEN each step goes on from the cursor the last one left
    steps = _walk(schedule, START + 3600, limit=3)
    # THEN every fire available by the horizon is made exactly once, each step full but
    # the last
    _made_once(schedule, START + 3600, steps)
    assert all(len(step) == 3 for step in steps[:-1])


@pytest.mark.parametrize("limit", range(1, 9))
def test_a_step_never_splits_fires_available_at_the_same_second(limit: int):
    # GIVEN a jittered minutely schedule two of whose fires become available at one second
    # (a cursor between them could not tell them apart: the second would be lost)
    schedule = _minutely(300, tied=True)
    # WHEN it is planned an hour ahead in steps of at most ``limit`` fires
    steps = _walk(schedule, START + 3600, limit)
    # THEN every fire is made exactly once; a step holds more than its limit only when all
    # its fires share one second (a tie that cannot be split)
    _made_once(schedule, START + 3600, steps)
    available = _available(schedule, range(START, START + 3601, 60))
    for step in steps:
        assert len(step) <= limit or len({available[f] for f in step}) == 1, step


def test_a_step_whose_fires_all_share_one_second_takes_them_all():
    # GIVEN a jittered schedule two of whose fires become available at one second, planned
    # from the second before it up to it, one fire a step
    schedule = _minutely(300, tied=True)
    available = _available(schedule, range(START, START + 3601, 60))
    tie = next(a for a in available.values() if list(available.values()).count(a) > 1)
    # WHEN the step is planned
    step = _step(schedule, tie - 1, tie, limit=1)
    # THEN both are made (a cursor between them could not tell them apart), and the step
    # reaches its horizon
    assert sorted(o.scheduled_for for o in step.occurrences) == sorted(
        f for f, a in available.items() if a == tie
    )
    assert step.cursor.planned_until == tie


def test_the_cursor_names_the_first_unhandled_fire_and_the_soonest_available():
    # GIVEN a flexible schedule whose fires (a minute apart) are jittered over five minutes,
    # so a later fire may become available before an earlier one
    schedule = _schedule("rate(1 minute)", window=300)
    available = _available(schedule, range(START, START + 3600, 60))
    for planned_until in range(START, START + 1800, 37):
        # WHEN everything available by planned_until is handled
        unhandled = {f: a for f, a in available.items() if a > planned_until}
        # THEN the cursor's next run is the earliest unhandled fire, and its next
        # availability the soonest of them
        assert cursor_after(schedule, planned_until) == Cursor(
            planned_until, min(unhandled), min(unhandled.values())
        ), planned_until


def test_a_large_catch_up_is_paced_in_whole_seconds_within_the_spread():
    # GIVEN a minutely schedule catching up its 30 latest misfires after an hour down, its
    # tenant's pace a minute apart (30 minutes: past SQS's 15-minute delay limit)
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 30}
    schedule = _schedule("rate(1 minute)", misfire=misfire)
    now = START + 3600
    # WHEN it is planned
    step = plan(
        schedule,
        planned_until=None,
        until=now,
        now=now,
        retention_seconds=86400,
        limit=1000,
        catchup_pace=60,
    )
    # THEN the 30 are released from now at one pace, compressed to fit the spread, each at
    # a whole second
    late = sorted(o.available_at - now for o in step.occurrences if o.scheduled_for < now - 60)
    pace = MAX_CATCHUP_SPREAD // 29
    assert late == [i * pace for i in range(30)]
    assert all(isinstance(o.available_at, int) for o in step.occurrences)


def test_handled_until_is_the_recorded_instant_or_the_second_before_a_legacy_cursor():
    # GIVEN a cursor that records how far planning went, and one written before it did
    recorded = _schedule("rate(1 minute)", next_run_at=1_800_000_060, planned_until=1_800_000_030)
    legacy = _schedule("rate(1 minute)", next_run_at=1_800_000_060)
    # THEN the first says it; the second has made every fire before its next run
    assert handled_until(recorded) == 1_800_000_030
    assert handled_until(legacy) == 1_800_000_059

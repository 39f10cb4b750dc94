"""punctual.planning: the fires one step makes and the cursor it leaves, checked against the
schedule's fires counted one by one (what the materializer and the API write)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from punctual.models import Schedule
from punctual.planning import MAX_CATCHUP_SPREAD, Cursor, cursor_after, new_occurrence, plan

CREATED = datetime(2026, 1, 1, 10, 7, 30, tzinfo=UTC)
START = int(CREATED.timestamp())


def _schedule(expression: str, window: int = 0, **extra: Any) -> Schedule:
    return Schedule.model_validate(
        extra
        | {
            "spec": {"kind": "rate", "expression": expression},
            "target": "default",
            "flexible_window_seconds": window,
            "tenant_id": "t1",
            "schedule_id": "sch_planning",
            "version": 1,
            "created_at": CREATED,
            "updated_at": CREATED,
        }
    )


def _available(schedule: Schedule, fires: range) -> dict[int, int]:
    """Each fire's available_at, from the occurrence it makes."""
    return {f: new_occurrence(schedule, f, 86400).available_at for f in fires}


def _step(schedule: Schedule, planned_until: int | None, until: int, **kw: Any) -> Any:
    return plan(
        schedule, planned_until=planned_until, until=until, now=START, retention_seconds=86400, **kw
    )


@pytest.mark.parametrize("window", [0, 300])
def test_a_step_cut_by_its_limit_goes_on_from_its_cursor_with_no_fire_twice_or_missed(
    window: int,
):
    # GIVEN a rate schedule firing every minute at :30 past, strict or jittered over five
    # minutes, planned an hour ahead at most three fires a step (so a cut step's cursor
    # stops on a fire's own available second, and a jittered fire before it is read again)
    schedule = _schedule("rate(1 minute)", window)
    until = START + 3600
    # WHEN each step goes on from the cursor the last one left
    made: list[int] = []
    handled = None
    for _ in range(100):
        step = _step(schedule, handled, until, limit=3)
        made += [o.scheduled_for for o in step.occurrences]
        handled = step.cursor.planned_until
        if handled >= until:
            break
    # THEN every fire available by the horizon is made exactly once
    available = _available(schedule, range(START, until + 1, 60))
    assert sorted(made) == sorted(f for f, a in available.items() if a <= until)
    assert len(made) == len(set(made))


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
    # GIVEN a minutely schedule catching up its 50 latest misfires after an hour down, its
    # tenant's pace a minute apart (50 minutes: past SQS's 15-minute delay limit)
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 50}
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
    # THEN the 50 are released from now at one pace, compressed to fit the spread, each at
    # a whole second
    late = sorted(o.available_at - now for o in step.occurrences if o.scheduled_for < now - 60)
    pace = MAX_CATCHUP_SPREAD // 49
    assert late == [i * pace for i in range(50)]
    assert all(isinstance(o.available_at, int) for o in step.occurrences)

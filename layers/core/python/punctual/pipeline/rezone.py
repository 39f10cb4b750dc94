"""Re-planning a schedule whose zone rules changed (docs/time.md, *When the rules change*).

A schedule records the tzdata release its cursor and occurrences were planned with, and
each occurrence its fire's local wall time (``local``). When a new release moves the
instants of a zone's wall times, a schedule planned under an older release is re-planned,
once, under the rules in use, keeping the time contract's one rule: each wall time fires
as its DST choice says (once, as in a fall-back, where a repeated wall time fires at one of
its instants; twice for one fired at BOTH):

- an occurrence not receivable yet (SCHEDULED, due later than now) at an instant the new
  rules still fire stays as it is; one at an instant they no longer fire is CANCELED (a
  message already sent ahead is dropped by the worker), and its wall time fires at its new
  instant: at once if that is now past, in its place if it is inside what was planned, by
  the materializer if it is later; a wall time that no longer exists (a new gap) is not
  made, as a cron fire in a gap is skipped;
- a fire of the new rules inside what was planned, whose instant has no occurrence and
  whose wall time was not planned (a time the old rules skipped), is made;
- the cursor stays at ``planned_until`` and moves past any following fire whose wall time
  was planned already (the new rules give it a later instant), its due bucket placed
  ahead of the shard's walk.

A COMPLETED schedule (every fire made) has its occurrences not receivable yet moved the
same way, and no cursor. Everything in one transaction, conditional on what was read.
Fires already receivable or taken stay as they are: they fired under the rules in force
when they were due. The reconciler re-plans every stale schedule of its shards (each
hour, and at once when run after a deploy); the materializer re-plans a stale schedule
it is about to step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from punctual.dal.common import ConditionFailed, Label
from punctual.dal.schedules import StoredSchedule
from punctual.domain.errors import Retryable
from punctual.domain.ids import is_manual, minute_of, occurrence_name
from punctual.domain.occurrence import Occurrence, OccurrenceState
from punctual.domain.planning import Cursor, cursor_after, new_occurrence, wall_text
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.services import Services
from punctual.timing import chosen_instants, get_zone, tzdata_version, utc_text

DAY = 86_400
# Zone offsets differ by at most 26 hours (and a dateline jump moved Samoa 24): a wall time
# planned under old rules lies within two days of its instant under new ones.
SPAN = 2 * DAY
REPLAN_ATTEMPTS = 3
MAX_ACTIONS = 100


@dataclass
class Replanned:
    """What one re-plan did (the reconciler's report counts and names them)."""

    schedule_id: str
    before: str | None
    after: str
    canceled: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)


REASON = "time zone rules changed"  # how a re-plan's CANCELED occurrences begin their reason


def rezoned(occurrence: Occurrence) -> bool:
    """Canceled by a re-plan (replaced by its fire's occurrence under the new rules)."""
    return occurrence.state is OccurrenceState.CANCELED and (occurrence.reason or "").startswith(
        REASON
    )


def stale(schedule: Schedule) -> bool:
    """Planned under another tzdata release than the one in use, in a zone."""
    return (
        schedule.zone_name is not None
        and schedule.tzdata_version is not None
        and schedule.tzdata_version != tzdata_version()
    )


def replan(services: Services, schedule_id: str) -> Replanned | None:
    """Re-plan the schedule if it is stale (None when it is not, or is gone), reading it
    again after a lost race; Retryable when it kept changing."""
    for _ in range(REPLAN_ATTEMPTS):
        stored = services.schedules.current(schedule_id)  # consistent: the conditions name it
        if stored is None or not stale(stored.schedule):
            return None
        walked = services.leases.watermark(stored.shard)
        if walked is None:
            services.leases.open(stored.shard, now=int(services.now()))
            continue
        actions, done = _plan(services, stored, walked)
        try:
            services.transactions.commit(actions)
        except (ConditionFailed, Retryable):
            continue
        return done
    raise Retryable(f"schedule {schedule_id} kept changing while it was re-planned; retry")


def _instants(schedule: Schedule, wall: str) -> tuple[int, ...]:
    """A local wall time's instants under the rules in use and the schedule's DST choice
    (none: it does not exist and is skipped; two: it repeats and fires at both)."""
    zone = schedule.zone_name
    assert zone is not None
    instants, _ = chosen_instants(datetime.fromisoformat(wall), get_zone(zone), schedule.dst)
    return instants


def _plan(
    services: Services, stored: StoredSchedule, walked: int
) -> tuple[list[tuple[Label, dict[str, Any]]], Replanned]:
    schedule = stored.schedule
    now = int(services.now())
    version = tzdata_version()
    done = Replanned(schedule.schedule_id, schedule.tzdata_version, version)
    handled = schedule.planned_until
    # COMPLETED: every fire was made, the last ones may not be receivable yet (a one-shot
    # shifted out of a gap by the old rules): those move as an active schedule's do, within
    # the span a wall time moves by, and there is no cursor to move.
    completed = schedule.state is ScheduleState.COMPLETED
    if completed:
        handled = now + SPAN
    elif schedule.state is not ScheduleState.ACTIVE or handled is None:
        # Nothing planned ahead (paused, canceled): only the release is new.
        return [
            (Label.SCHEDULE, services.schedules.replanned_action(stored, None, None, version))
        ], done
    # The occurrences it makes carry the version's payload: read from its version item (the
    # CURRENT item has only a mark of it), never taken for an empty one.
    schedule = services.schedules.with_payload(stored).schedule
    # Consistent: an occurrence made or taken a moment ago decides what is replaced.
    window = services.occurrences.window(
        schedule.schedule_id, since=now - SPAN, until=handled + SPAN, consistent=True
    )
    found = [
        o
        for o in window.occurrences
        if o.schedule_version == schedule.run_version and not is_manual(o.occurrence_id)
    ]
    fires = set(schedule.rule().fires(now - SPAN, handled + SPAN))
    # (An instant whose key holds a tenant's unreadable item is taken: nothing is put there.)
    at = {o.scheduled_for for o in found} | {
        instant
        for _, version, instant, manual in map(occurrence_name, window.unreadable)
        if version == schedule.run_version and manual is None
    }
    # Each wall time fires as often as the rules in use and its DST choice say (once; twice
    # for a repeated one fired at BOTH): how many times each is planned.
    walls = Counter(o.local for o in found if o.local is not None)

    def planned_enough(wall: str | None) -> bool:
        return wall is not None and walls[wall] >= max(1, len(_instants(schedule, wall)))

    actions: list[tuple[Label, dict[str, Any]]] = []
    retention = services.settings.retention_days * DAY
    reason = f"{REASON} (tzdata {schedule.tzdata_version} -> {version})"

    def make(instant: int) -> None:
        occurrence = new_occurrence(schedule, instant, retention)
        if occurrence.available_at <= now:  # moved into the past: late, so at once
            occurrence = occurrence.model_copy(update={"available_at": now})
        at.add(instant)
        walls[occurrence.local or ""] += 1
        actions.append(
            (
                Label.OCCURRENCE,
                services.occurrences.put_new_action(occurrence, schedule.known_payload),
            )
        )
        done.made.append(occurrence.occurrence_id)

    # Planned, not receivable yet, at an instant the rules in use no longer fire: canceled;
    # its wall time fires at its new instant (at once if that is past, by the cursor if it
    # is after what was planned), unless that instant has its occurrence already.
    for occurrence in sorted(found, key=lambda o: o.scheduled_for):
        if not _pending(occurrence, now) or occurrence.scheduled_for in fires:
            continue
        moved = () if occurrence.local is None else _instants(schedule, occurrence.local)
        note = f"{reason}: {occurrence.local} is " + (
            "now at " + " and ".join(map(utc_text, moved))
            if moved
            else "no longer a time of its zone"
        )
        actions.append(
            (
                Label.OCCURRENCE,
                services.occurrences.cancel_scheduled_action(occurrence.occurrence_id, note),
            )
        )
        done.canceled.append(occurrence.occurrence_id)
        at.discard(occurrence.scheduled_for)
        walls[occurrence.local or ""] -= 1
        for instant in moved:
            # (A fire of the rules in use: never the canceled instant itself, nor one its
            # bounds leave out.)
            if instant in fires and instant not in at and schedule.fires_after < instant <= handled:
                make(instant)
    # Fires of the rules in use inside what was planned, at an instant with no occurrence
    # and a wall time not planned as often as it fires (one the old rules did not have,
    # moved there, or that now repeats and fires at both).
    for fire in sorted(fires):
        new = max(now, schedule.fires_after) < fire <= handled and fire not in at
        if new and not planned_enough(wall_text(schedule, fire)):
            make(fire)
    if completed:
        actions.append(
            (Label.SCHEDULE, services.schedules.replanned_action(stored, None, None, version))
        )
    else:
        actions += _cursor_actions(services, stored, schedule, walked, planned_enough)
    if len(actions) > MAX_ACTIONS:
        raise Retryable(f"schedule {schedule.schedule_id}: too much to re-plan in one go")
    return actions, done


def _cursor_actions(
    services: Services,
    stored: StoredSchedule,
    schedule: Schedule,
    walked: int,
    planned_enough: Callable[[str | None], bool],
) -> list[tuple[Label, dict[str, Any]]]:
    """The schedule's new cursor under the rules in use, and its due bucket placed ahead of
    the shard's walk."""
    handled = schedule.planned_until
    assert handled is not None
    retention = services.settings.retention_days * DAY
    version = tzdata_version()
    actions: list[tuple[Label, dict[str, Any]]] = []
    # The cursor: the first fire after what was planned whose wall time is not planned yet
    # (a wall time the new rules give a later instant has fired or is planned already).
    cursor = cursor_after(schedule, handled)
    while cursor.next_run_at is not None and planned_enough(
        wall_text(schedule, cursor.next_run_at)
    ):
        due = new_occurrence(schedule, cursor.next_run_at, retention).available_at
        cursor = cursor_after(schedule, max(cursor.planned_until, due))
    if cursor.next_available_at is None:
        # No fire left under the rules in use: the materializer completes it at its next step.
        cursor = Cursor(cursor.planned_until, None, cursor.planned_until)
    assert cursor.next_available_at is not None
    placed = max(cursor.next_available_at, walked + 2 * 60)
    actions.append(
        (Label.SCHEDULE, services.schedules.replanned_action(stored, cursor, placed, version))
    )
    actions.append(
        (Label.SHARD, services.leases.not_walked_action(stored.shard, minute_of(placed)))
    )
    return actions


def _pending(occurrence: Occurrence, now: int) -> bool:
    """Planned and not receivable yet: the only occurrences a new release still moves."""
    return occurrence.state is OccurrenceState.SCHEDULED and occurrence.available_at > now

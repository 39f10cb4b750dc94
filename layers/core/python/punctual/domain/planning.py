"""Turning schedule fires into occurrences: the one planning step the API and the
materializer share, so both produce the same ids, jitter, misfire decisions and cursor.

Planning goes in order of availability, not of scheduled time. A flexible fire becomes
receivable at ``scheduled_for + jitter`` (jitter < the window), so a later fire can be due
before an earlier one; a cursor that stopped at the first fire not yet due would hold back
every later fire that is due sooner, and they would then be judged late. The cursor is
therefore ``planned_until``: every fire of the version (after ``Schedule.fires_after``)
whose ``available_at`` is at or before it has been handled (made an occurrence, or recorded
MISSED by the misfire policy), and no other. Everything else follows from it and the rule:

- ``next_run_at``: the earliest fire not yet handled;
- ``next_available_at``: the earliest ``available_at`` among those: where the schedule sits
  in the due index, so the walk reaches it before it is due.

For a strict schedule (no window) ``available_at == scheduled_for`` and this is the plain
"next fire" cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from punctual.domain.ids import available_at, occurrence_id
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.domain.schedule import Schedule
from punctual.domain.specs import AtSpec
from punctual.timing import CronRule, get_zone, local_wall

# A direct (API-side) materialization stays far below DynamoDB's 100 actions per
# transaction; anything beyond is left to the materializer through the cursor.
MAX_DIRECT = 25
# SQS delays a message at most 900 s: a catch-up paced slower than that is compressed.
MAX_CATCHUP_SPREAD = 840  # seconds, with a tick to spare
# A fire made this long after it was due (within max_lateness, so not a misfire) is
# recovery work, not a fire due now: it goes by the catch-up lane (occurrence.Lane). A tick a
# little late stays on time.
CATCHUP_AFTER = 300  # seconds


@dataclass(frozen=True, slots=True)
class Cursor:
    planned_until: int
    next_run_at: int | None  # None: no fire left to handle
    next_available_at: int | None


@dataclass(frozen=True, slots=True)
class Catchup:
    """A catch-up that spans several steps keeps one pace: released so far, seconds apart."""

    released: int = 0
    pace: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    occurrences: list[Occurrence]
    missed: list[int]  # scheduled_for of the fires recorded MISSED, in order
    cursor: Cursor
    catchup: Catchup = field(default_factory=Catchup)


@dataclass(frozen=True, slots=True, order=True)
class _Fire:
    available_at: int
    scheduled_for: int
    occurrence_id: str


def new_occurrence(schedule: Schedule, scheduled_for: int, retention_seconds: int) -> Occurrence:
    """The occurrence of one fire, receivable at its own (jittered) time."""
    fire = _fire(schedule, scheduled_for)
    return _occurrence(schedule, fire, fire.available_at, retention_seconds)


def _fire(schedule: Schedule, scheduled_for: int) -> _Fire:
    oid = occurrence_id(schedule.schedule_id, schedule.run_version, scheduled_for)
    return _Fire(
        available_at(oid, scheduled_for, schedule.flexible_window_seconds), scheduled_for, oid
    )


def _unhandled(schedule: Schedule, planned_until: int, until: int) -> list[_Fire]:
    """Fires not yet handled whose available_at is at or before ``until``, by availability."""
    rule = schedule.rule()
    # A fire at or before planned_until - window is due by planned_until: handled already.
    after = max(schedule.fires_after, planned_until - schedule.flexible_window_seconds)
    found = []
    fire = rule.next_after(after)
    while fire is not None and fire <= until:  # available_at >= scheduled_for
        candidate = _fire(schedule, fire)
        if planned_until < candidate.available_at <= until:
            found.append(candidate)
        fire = rule.next_after(fire)
    return sorted(found)


def cursor_after(schedule: Schedule, planned_until: int) -> Cursor:
    """The cursor once everything due by ``planned_until`` is handled."""
    rule = schedule.rule()
    after = max(schedule.fires_after, planned_until - schedule.flexible_window_seconds)
    first: int | None = None
    soonest: int | None = None
    fire = rule.next_after(after)
    # available_at >= scheduled_for: a fire at or after the soonest found cannot beat it.
    while fire is not None and (soonest is None or fire < soonest):
        due = _fire(schedule, fire).available_at
        if due > planned_until:
            first = fire if first is None else first
            soonest = due if soonest is None else min(soonest, due)
        fire = rule.next_after(fire)
    return Cursor(planned_until, first, soonest)


def plan(
    schedule: Schedule,
    *,
    planned_until: int | None,
    until: int,
    now: int,
    retention_seconds: int,
    limit: int = MAX_DIRECT,
    catchup_pace: int = 0,
    resume: Catchup | None = None,
) -> Plan:
    """One step: the fires not yet handled that are due by ``until``.

    Fires whose ``available_at`` is more than ``max_lateness`` before ``now`` are misfires:
    the latest ``effective_catchup_limit`` of them fire (released from ``now``, spaced by
    ``catchup_pace`` for CATCHUP), the rest are returned as missed. The others become
    occurrences receivable at their own ``available_at``. At most ``limit`` occurrences:
    the cursor then stops after the last one made and a follow-up step goes on (``resume``
    carries the catch-up's pace into it).
    """
    handled = schedule.fires_after if planned_until is None else planned_until
    fires = _unhandled(schedule, handled, until)
    policy = schedule.misfire
    late_before = now - policy.max_lateness_seconds
    late = [f for f in fires if f.available_at < late_before]
    due = fires[len(late) :]
    keep = min(len(late), policy.effective_catchup_limit)
    missed, kept = late[: len(late) - keep], late[len(late) - keep :]
    if resume is None:
        pace = catchup_pace
        if keep > 1:
            pace = min(pace, MAX_CATCHUP_SPREAD // (keep - 1))
        resume = Catchup(0, pace)
    chosen = kept + due
    if len(chosen) > limit:
        cut = limit
        # Never split fires that share one available_at: the cursor could not tell them apart.
        while cut > 0 and chosen[cut].available_at == chosen[cut - 1].available_at:
            cut -= 1
        if cut == 0:
            # The first second's fires alone pass the limit: they go together (all of them,
            # when every fire left shares it).
            first = chosen[0].available_at
            cut = next((i for i, f in enumerate(chosen) if f.available_at > first), len(chosen))
        chosen, reached = chosen[:cut], chosen[cut - 1].available_at
    else:
        reached = until
    released = kept[: len(chosen)]
    occurrences = (
        [
            _occurrence(
                schedule,
                f,
                now + (resume.released + i) * resume.pace,
                retention_seconds,
                lane=Lane.CATCHUP,  # fired after its time: relayed apart from fires due now
            )
            for i, f in enumerate(released)
        ]
        + [
            _occurrence(
                schedule,
                f,
                f.available_at,
                retention_seconds,
                lane=Lane.CATCHUP if f.available_at < now - CATCHUP_AFTER else None,
            )
            for f in chosen[len(released) :]
        ]
    )
    return Plan(
        occurrences=occurrences,
        missed=sorted(f.scheduled_for for f in missed),
        cursor=cursor_after(schedule, reached),
        catchup=Catchup(resume.released + len(released), resume.pace),
    )


def wall_text(schedule: Schedule, instant: int) -> str | None:
    """The local wall time a fire at ``instant`` is, in the schedule's zone under the rules
    in use ('2026-12-02T09:00:00'); None for a schedule no zone places. The instant's own,
    except for a fire its DST choice shifted to a gap's end (docs/time.md): the wall time
    that matched, which the clocks skipped (a one-shot's written time; a cron's earliest
    matching one in the gap). A re-plan under other rules keys on it."""
    zone = schedule.zone_name
    if zone is None:
        return None
    rule = schedule.rule()
    if isinstance(rule, CronRule):
        return rule.matched_wall(instant).isoformat()
    if isinstance(schedule.spec, AtSpec) and schedule.spec.dst is not None:
        return datetime.fromisoformat(schedule.spec.at.strip()).replace(microsecond=0).isoformat()
    return local_wall(instant, get_zone(zone)).isoformat()


def shows_wall(schedule: Schedule, instant: int, wall: str) -> bool:
    """Whether the rules in use put a fire of ``wall`` (an occurrence's ``local``) at
    ``instant``: the wall time ``instant`` is (``wall_text``), or, for a one-shot whose DST
    choice decides its instants, one of those instants (its wall time is its written one,
    whatever the instant)."""
    if isinstance(schedule.spec, AtSpec) and schedule.spec.dst is not None:
        return bool(schedule.rule().fires(instant - 1, instant))
    return wall_text(schedule, instant) == wall


def _occurrence(
    schedule: Schedule, fire: _Fire, receivable: int, retention: int, lane: Lane | None = None
) -> Occurrence:
    return Occurrence(
        lane=lane,
        local=wall_text(schedule, fire.scheduled_for),
        occurrence_id=fire.occurrence_id,
        tenant_id=schedule.tenant_id,
        schedule_id=schedule.schedule_id,
        schedule_version=schedule.run_version,
        scheduled_for=fire.scheduled_for,
        available_at=receivable,
        target=schedule.target,
        state=OccurrenceState.SCHEDULED,
        expires_at=receivable + retention,
    )


def handled_until(schedule: Schedule) -> int:
    """Every fire due (available) by this instant has been made (punctual.domain.planning)."""
    if schedule.planned_until is not None:
        return schedule.planned_until
    # A cursor written before planned_until existed: every fire before next_run_at.
    return (schedule.next_run_at or 0) - 1

"""Which occurrences must exist: the reconciler's pure rules, over a schedule's version
history and the time rules (``punctual.timing``; never the materializer's planning code).

Which version owns an instant follows from how versions are written and materialized:
- version N applies from its ``effective_from`` (the instant of the change); version 1 owns
  a fire at its creation instant, later versions only fires strictly after theirs;
- an instant of version N that was due (``available_at``) by the time version N+1 took
  over must exist as N's occurrence, whatever became of it (an update CANCELs the ones not
  yet sent);
- instants of N due after that *may* exist: the API and the materializer plan up to the
  lookahead ahead, and the change then CANCELed them (or the worker refuses them). Found,
  they are SUPERSEDED; absent, nothing is wrong;
- a PAUSED or CANCELED version owns nothing;
- a version that kept its predecessor's run version (a rename) changed nothing that runs.

Beside that, what lets the reconciler leave a schedule unread (``dormant``, ``idle``), and
what it leaves to the materializer (``not_handled_yet``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from punctual.dal.schedules import ScheduleVersion
from punctual.domain.ids import available_at, occurrence_id
from punctual.domain.occurrence import Occurrence, OccurrenceState
from punctual.domain.schedule import OWNS_FIRES, Schedule, ScheduleState
from punctual.pipeline.redrive import REDRIVE_AFTER
from punctual.pipeline.rezone import stale
from punctual.timing.zones import offset_changes

DAY = 24 * 3600


@dataclass(frozen=True, slots=True)
class Expected:
    """One fire of one version inside the window, and whether its occurrence must exist."""

    schedule_id: str
    version: int
    scheduled_for: int
    occurrence_id: str
    available_at: int
    required: bool  # False: it may exist (planned ahead, then superseded)


def expected_occurrences(
    versions: Sequence[ScheduleVersion], start: int, end: int, *, horizon: int
) -> list[Expected]:
    """Every fire of ``versions`` (consecutive, oldest first) in [start, end).

    ``horizon``: how far past a version change its predecessor may have been planned (the
    API's and the materializer's lookahead); fires due later than that are not expected at
    all.
    """
    found: list[Expected] = []
    # A version that kept its predecessor's run version (a rename) changed nothing that runs:
    # its fires are the run version's, owned from that version's change on.
    runs = [v for i, v in enumerate(versions) if i == 0 or not _same_run(versions[i - 1], v)]
    for index, version in enumerate(runs):
        schedule = version.schedule
        if schedule.state not in OWNS_FIRES:
            continue
        # Version 1 owns a fire at its creation instant (a rate anchored there fires at
        # once); a later version plans strictly after its change (a renamed one's run
        # version's change, read from the history before it).
        began = version.effective_from if schedule.run_version == schedule.version else None
        after = (began or schedule.run_from) - (1 if schedule.run_version == 1 else 0)
        successor = runs[index + 1].effective_from if index + 1 < len(runs) else None
        runs_as = schedule.run_version
        for fire in schedule.rule().fires(start - 1, end - 1):
            if fire <= after:
                continue
            oid = occurrence_id(schedule.schedule_id, runs_as, fire)
            due = available_at(oid, fire, schedule.flexible_window_seconds)
            required = successor is None or due <= successor
            if not required and successor is not None and due > successor + horizon:
                continue
            found.append(Expected(schedule.schedule_id, runs_as, fire, oid, due, required))
    return found


def _same_run(before: ScheduleVersion, after: ScheduleVersion) -> bool:
    return after.schedule.run_version == before.schedule.run_version


def by_version(versions: Sequence[ScheduleVersion]) -> dict[int, Schedule]:
    """Each version's schedule, by its version and by its run version (the version its
    occurrences carry): a rename's run version may be older than the history read."""
    found: dict[int, Schedule] = {}
    for version in versions:
        found[version.schedule.version] = version.schedule
        found.setdefault(version.schedule.run_version, version.schedule)
    return found


def dormant(version: ScheduleVersion, since: int) -> bool:
    """True when nothing of the schedule can be stored after ``since``: paused, canceled or
    completed before it, it left the due index, and the materializer's version condition
    refuses any late step. Every other schedule is read, to find strays (UNEXPECTED) even in
    an hour where it owns nothing, e.g. a nonexistent wall time fired anyway."""
    schedule = version.schedule
    if version.effective_from > since:
        return False
    if schedule.state not in OWNS_FIRES:  # paused or canceled
        return True
    return schedule.state is ScheduleState.COMPLETED and schedule.rule().next_after(since) is None


def idle(version: ScheduleVersion, start: int, end: int, since: int) -> bool:
    """True when nothing can be stored in [start, end) for a schedule that owns no fire in
    it, so its occurrences are not read (the reconciler's largest cost: docs/capacity.md):
    its version has been in effect since ``since`` (no earlier version's fire trails into
    the window), it was planned under the zone rules in use (``rezone.stale``), no run now
    was made for ``start`` or later and no re-plan left older rules' occurrences there
    (``manual_through``: ``ScheduleStore.manual_run_action``, ``replanned_action`` and
    ``backfill_made_action``, whose records the window may hold), and its zone's offset does not
    change within a day of the window (where a planner's mistake would put a fire the rules
    do not give: such a stray stays UNEXPECTED). What this gives up (docs/operations.md): a
    stray at another wrong hour is not reported there; the fire it should have been is
    still MISSING in its own hour."""
    zone = version.schedule.zone_name
    return (
        version.effective_from <= since
        and (version.manual_through is None or version.manual_through < start)
        and not stale(version.schedule)
        and (zone is None or not offset_changes(zone, start - DAY, end + DAY))
    )


def may_have_backfilled(version: ScheduleVersion, start: int, index_settled: bool) -> bool:
    """Whether a backfill of the schedule may have been made in or after the window that
    starts at ``start``: every backfill raises ``manual_through`` to when it was made, so it
    is not before the window; or the index may not show that yet (the window closed a
    moment ago); or a version that began after the window opened wrote the item whole,
    which drops the mark."""
    return (
        not index_settled
        or version.effective_from > start
        or (version.manual_through is not None and version.manual_through >= start)
    )


def merged(ranges: Iterable[tuple[int, int]], low: int, high: int) -> list[tuple[int, int]]:
    """``ranges`` ([from, to) each) clipped to [low, high), overlapping ones joined."""
    merged: list[tuple[int, int]] = []
    for since, until in sorted((max(a, low), min(b, high)) for a, b in ranges):
        if since >= until:
            continue
        if merged and since <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], until))
        else:
            merged.append((since, until))
    return merged


def may_be_overdue(occurrence: Occurrence, now: int) -> bool:
    """What the stored model already rules out (RETRY_WAIT's retry time is read anew)."""
    if occurrence.state is OccurrenceState.SCHEDULED:
        return occurrence.available_at + REDRIVE_AFTER < now
    if occurrence.state is OccurrenceState.RUNNING:
        return (occurrence.lease_expires_at or 0) + REDRIVE_AFTER < now
    return True


def not_handled_yet(current: Schedule, gap: Expected) -> bool:
    """True while the materializer's cursor has not passed the fire: it will apply the misfire
    policy itself, and an occurrence put first would block its step."""
    if current.next_run_at is None or gap.version != current.run_version:
        return False
    handled = current.planned_until
    if handled is None:  # a cursor written before planned_until existed
        return gap.scheduled_for >= current.next_run_at
    return gap.available_at > handled


def fired_late(occurrence: Occurrence, window_seconds: int) -> bool:
    """True for an occurrence fired by a misfire policy: the materializer (and the repair)
    make a late fire receivable from the moment it is handled, not at its jittered instant."""
    due = available_at(occurrence.occurrence_id, occurrence.scheduled_for, window_seconds)
    return occurrence.available_at != due

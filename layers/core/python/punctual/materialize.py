"""Turning schedule fires into occurrences: the one planning step the API and the
materializer share, so both produce the same ids, jitter and cursor."""

from __future__ import annotations

from dataclasses import dataclass

from punctual.ids import available_at, occurrence_id
from punctual.models import Occurrence, OccurrenceState, Schedule

# A direct (API-side) materialization stays far below DynamoDB's 100 actions per
# transaction; anything beyond is left to the materializer through the cursor.
MAX_DIRECT = 25


@dataclass(frozen=True, slots=True)
class Planned:
    occurrences: list[Occurrence]
    next_run_at: int | None  # the first fire not materialized here
    next_available_at: int | None


def new_occurrence(schedule: Schedule, scheduled_for: int, retention_seconds: int) -> Occurrence:
    occ_id = occurrence_id(schedule.schedule_id, schedule.version, scheduled_for)
    due = available_at(occ_id, scheduled_for, schedule.flexible_window_seconds)
    return Occurrence(
        occurrence_id=occ_id,
        tenant_id=schedule.tenant_id,
        schedule_id=schedule.schedule_id,
        schedule_version=schedule.version,
        scheduled_for=scheduled_for,
        available_at=due,
        target=schedule.target,
        state=OccurrenceState.SCHEDULED,
        expires_at=due + retention_seconds,
    )


def plan(
    schedule: Schedule,
    *,
    after: int,
    materialize_until: int,
    retention_seconds: int,
    limit: int = MAX_DIRECT,
) -> Planned:
    """Fires strictly after ``after``: those receivable by ``materialize_until`` become
    occurrences now (at most ``limit``), the next one becomes the cursor."""
    rule = schedule.rule()
    occurrences: list[Occurrence] = []
    fire = rule.next_after(after)
    while fire is not None:
        occurrence = new_occurrence(schedule, fire, retention_seconds)
        if occurrence.available_at > materialize_until or len(occurrences) == limit:
            return Planned(occurrences, fire, occurrence.available_at)
        occurrences.append(occurrence)
        fire = rule.next_after(fire)
    return Planned(occurrences, None, None)

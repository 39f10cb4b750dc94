"""An occurrence (one definite instant of one schedule version), its states and lanes,
and an attempt (one delivery and processing try of it)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from punctual.domain.fields import EpochSeconds, Record, WallTime


class OccurrenceState(StrEnum):
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    DEAD = "DEAD"
    MISSED = "MISSED"
    CANCELED = "CANCELED"
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"


class Lane(StrEnum):
    """Which relay delivers an occurrence; an occurrence without one goes in the on-time lane.

    CATCHUP: a fire made after its time (a misfire's catch-up, a reconciler's repair, a
    backfill). Its stream record is read by a relay of its own (its own event source
    mapping, with bounded concurrency), so a catch-up of any size never queues ahead of
    fires due now (docs/operations.md, *Catch-up lane*)."""

    CATCHUP = "CATCHUP"


# Every allowed move. Each is carried out as a conditional write from the expected state.
TRANSITIONS: dict[OccurrenceState, frozenset[OccurrenceState]] = {
    # SCHEDULED covers "sent and waiting in the queue": the relay does not mark the send
    # (one write unit per occurrence saved, docs/decisions.md 2026-11-30); the worker's claim
    # moves it on and records enqueued_at from the message's SentTimestamp.
    OccurrenceState.SCHEDULED: frozenset(
        {
            OccurrenceState.RUNNING,
            OccurrenceState.SKIPPED_OVERLAP,
            OccurrenceState.CANCELED,
            OccurrenceState.MISSED,
            OccurrenceState.DEAD,
        }
    ),
    # RUNNING -> RUNNING: another worker takes over an expired lease (new token).
    # RUNNING -> SKIPPED_OVERLAP: an abandoned run (lease expired) whose schedule's run slot
    # another occurrence took meanwhile.
    OccurrenceState.RUNNING: frozenset(
        {
            OccurrenceState.RUNNING,
            OccurrenceState.SUCCEEDED,
            OccurrenceState.RETRY_WAIT,
            OccurrenceState.DEAD,
            OccurrenceState.CANCELED,
            OccurrenceState.SKIPPED_OVERLAP,
        }
    ),
    OccurrenceState.RETRY_WAIT: frozenset(
        {
            OccurrenceState.RUNNING,
            OccurrenceState.CANCELED,
            OccurrenceState.SKIPPED_OVERLAP,
            OccurrenceState.DEAD,
        }
    ),
    OccurrenceState.SUCCEEDED: frozenset(),
    OccurrenceState.DEAD: frozenset(),
    OccurrenceState.MISSED: frozenset(),
    OccurrenceState.CANCELED: frozenset(),
    OccurrenceState.SKIPPED_OVERLAP: frozenset(),
}
TERMINAL = frozenset(state for state, moves in TRANSITIONS.items() if not moves)


def can_transition(current: OccurrenceState, target: OccurrenceState) -> bool:
    return target in TRANSITIONS[current]


class Occurrence(Record):
    occurrence_id: str
    tenant_id: str
    schedule_id: str
    schedule_version: int = Field(ge=1)
    scheduled_for: EpochSeconds = Field(description="Epoch seconds, UTC.")
    available_at: EpochSeconds = Field(description="scheduled_for plus the deterministic jitter.")
    target: str
    state: OccurrenceState = OccurrenceState.SCHEDULED
    attempt_count: int = Field(default=0, ge=0)
    lease_token: str | None = None
    lease_expires_at: EpochSeconds | None = None
    enqueued_at: EpochSeconds | None = Field(
        default=None,
        description="When the relay sent its message (SQS SentTimestamp), recorded by the "
        "worker's first claim.",
    )
    reason: str | None = Field(default=None, description="Why it is DEAD, MISSED or CANCELED.")
    expires_at: EpochSeconds | None = Field(default=None, description="TTL: when retention ends.")
    local: WallTime | None = Field(
        default=None,
        description="The fire's local wall time in its schedule's zone, as planned (a "
        "zone-based schedule's): what a change of the zone's rules keeps.",
    )
    lane: Lane | None = Field(
        default=None, description="CATCHUP: made after its time, relayed in the catch-up lane."
    )


class AttemptOutcome(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    RETRY = "RETRY"  # transient failure, another attempt follows
    DEAD = "DEAD"  # permanent failure or retries exhausted
    LOST = "LOST"  # the lease expired and another worker took over


class Attempt(Record):
    occurrence_id: str
    attempt_no: int = Field(ge=1)
    started_at: EpochSeconds
    lease_expires_at: EpochSeconds
    finished_at: EpochSeconds | None = None
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    error: str | None = None

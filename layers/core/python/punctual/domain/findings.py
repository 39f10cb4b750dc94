"""What the reconciler finds per expected fire, and its report of one window and shard."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from punctual.domain.occurrence import OccurrenceState


class Finding(StrEnum):
    """What the reconciler concluded about one instant or one stored occurrence."""

    SUCCEEDED = "SUCCEEDED"
    DEAD = "DEAD"
    CANCELED = "CANCELED"
    MISSED = "MISSED"  # by the misfire policy: a MISSED item or the materializer's summary
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"
    IN_FLIGHT = "IN_FLIGHT"  # SCHEDULED, RUNNING, RETRY_WAIT
    MISSING = "MISSING"  # expected, and no record of it at all
    UNEXPECTED = "UNEXPECTED"  # stored, and no version owns it
    SUPERSEDED = "SUPERSEDED"  # stored ahead of time, then a newer version took over


# What a stored occurrence's state says of it (an occurrence no fire owns aside: UNEXPECTED
# or SUPERSEDED, which only the reconciler's ownership rules tell).
FOUND_IN: dict[OccurrenceState, Finding] = {
    OccurrenceState.SUCCEEDED: Finding.SUCCEEDED,
    OccurrenceState.DEAD: Finding.DEAD,
    OccurrenceState.CANCELED: Finding.CANCELED,
    OccurrenceState.MISSED: Finding.MISSED,
    OccurrenceState.SKIPPED_OVERLAP: Finding.SKIPPED_OVERLAP,
    OccurrenceState.SCHEDULED: Finding.IN_FLIGHT,
    OccurrenceState.RUNNING: Finding.IN_FLIGHT,
    OccurrenceState.RETRY_WAIT: Finding.IN_FLIGHT,
}


class ReconcileReport(BaseModel):
    """The summary of one reconcile run over one shard and one window."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    shard: int
    window_start: int
    window_end: int
    run_at: int
    # False: the run ran out of time before the last schedule, or could not write the
    # tenants' ledger pages of the hour (punctual.domain.ledger): checked again either way.
    complete: bool
    repair: bool
    schedules: int  # schedules whose occurrences were read (not dormant or idle)
    counts: dict[Finding, int]
    examples: dict[Finding, list[str]]  # up to EXAMPLES occurrence ids per class
    repaired_fired: int  # MISSING ones materialized to fire now
    repaired_missed: int  # MISSING ones recorded MISSED (policy, or a superseded version)
    deferred: int  # MISSING ones the materializer has not passed yet: left to it
    repair_conflicts: int  # MISSING ones whose repair lost a race twice: next run
    cursors_moved: int = 0  # schedules left in a due bucket the walk had passed, moved ahead
    redriven: int = 0  # open occurrences no worker took long after they were due: re-sent
    replanned: int = 0  # schedules planned under older zone rules, re-planned (rezone.py)
    # Items not judged: not occurrences Punctual wrote (a tenant's bad data, docs/security.md)
    malformed: int = 0

    @property
    def missing(self) -> int:
        return self.counts.get(Finding.MISSING, 0)

    @property
    def settled(self) -> bool:
        """Nothing in the window needs another look: fully checked, every gap repaired, none
        left to the materializer, none in flight. A later loss (a message lost after the
        send, a materializer that never makes a deferred fire because the version changed)
        can only happen to what is still open, so a window stays unsettled, and a scheduled
        run checks it again (and re-drives what became overdue), until all of it is done."""
        return (
            self.complete
            and self.deferred == 0
            and self.repair_conflicts == 0
            and self.repaired_fired == 0  # (made just now: in flight, not yet delivered)
            and self.missing == self.repaired_missed
            and self.counts.get(Finding.IN_FLIGHT, 0) == 0
        )

    @property
    def unexpected(self) -> int:
        return self.counts.get(Finding.UNEXPECTED, 0)

"""How a schedule's recent fires went (GET /v1/schedules/{id}, ``recent``): lags, outcomes
and the last failure, computed from what is already stored (the fires' occurrence items with
their attempt histories, and the schedule's misfire episodes). Nothing is written for them
on the hot path; the cost is one read of the last fires' items per GET (docs/operations.md,
*A schedule's recent fires*). And where one occurrence's time went (``state_times``: due to
receivable, receivable to claimed, each run, each retry's wait), from the same items.

The fires are the schedule's own (its rule's instants): a manual run (run now, backfill) is
no fire of it, and left out. Every figure is the tenant's own data: a worker of the tenant
writes the attempt histories, so a figure is what its items say, and an item that does not
parse is counted in ``unreadable``, never an error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from punctual.domain.occurrence import Attempt, AttemptOutcome, Occurrence, OccurrenceState
from punctual.domain.schedule import MissedEpisode

RECENT_FIRES = 100  # the fires read when the request does not say
MAX_RECENT_FIRES = 500  # at most (a GET reads their items)
OPEN = frozenset({OccurrenceState.SCHEDULED, OccurrenceState.RUNNING, OccurrenceState.RETRY_WAIT})
# The attempt outcomes that are a failure of that attempt.
_FAILED = frozenset({AttemptOutcome.RETRY, AttemptOutcome.DEAD, AttemptOutcome.LOST})


@dataclass(frozen=True, slots=True)
class Spread:
    """Seconds over some fires: how many were measured, the median, the 99th percentile
    (nearest rank) and the largest."""

    count: int
    p50: int
    p99: int
    max: int


def spread(values: Sequence[int]) -> Spread | None:
    """The spread of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)

    def rank(p: int) -> int:
        return ordered[max(0, math.ceil(p * len(ordered) / 100) - 1)]

    return Spread(len(ordered), rank(50), rank(99), ordered[-1])


@dataclass(frozen=True, slots=True)
class Failure:
    """The latest failure: a failed attempt (RETRY, DEAD, LOST), an occurrence that ended
    DEAD or MISSED, or fires the misfire policy recorded MISSED (an episode: no occurrence,
    so no id; ``scheduled_for`` is its latest fire)."""

    occurrence_id: str | None
    scheduled_for: int
    at: int  # when it happened (an attempt's end or start, else the fire's due time)
    what: str  # RETRY, DEAD, LOST (an attempt's outcome) or DEAD, MISSED (the occurrence's)
    error: str | None


@dataclass(frozen=True, slots=True)
class RecentFigures:
    """How the last ``fires`` fires (since ``since``) went. A fire is counted once by its
    occurrence's state (open: not ended yet) and, besides, in ``retried`` when it took more
    than one attempt."""

    fires: int
    since: int | None
    receivable_lag: Spread | None
    start_lag: Spread | None
    succeeded: int
    retried: int
    dead: int
    missed: int
    skipped: int
    canceled: int
    open: int
    last_failure: Failure | None
    unreadable: int


def receivable_lag(occurrence: Occurrence) -> int | None:
    """How late its message became receivable: sent ahead with a delay, it was receivable at
    its due time (0); sent late, when sent. None until a worker's claim recorded the send
    (``enqueued_at``, SQS's SentTimestamp)."""
    sent = occurrence.enqueued_at
    return None if sent is None else max(sent, occurrence.available_at) - occurrence.available_at


def start_lag(occurrence: Occurrence, attempts: Sequence[Attempt]) -> int | None:
    """From its due time to its first attempt's start (by the worker's clock: negative if
    that clock is behind). None before a worker claimed it."""
    return None if not attempts else attempts[0].started_at - occurrence.available_at


@dataclass(frozen=True, slots=True)
class StateTimes:
    """Where an occurrence's time went, in seconds: from due (``available_at``) to
    receivable (its message sent; sent ahead with a delay, receivable at its due time: 0),
    from receivable to its first claim, each finished attempt's run (claimed to finished),
    and each wait between an attempt's end and the next one's start (a retry's back-off;
    none after an attempt taken over, which has no end). None or empty: not reached yet. By
    the clocks that wrote them: a worker's clock behind SQS's shows a negative wait, kept
    as measured."""

    to_receivable: int | None
    to_claim: int | None
    runs: tuple[int, ...]
    retry_waits: tuple[int, ...]


def state_times(occurrence: Occurrence, attempts: Sequence[Attempt]) -> StateTimes:
    """The time ``occurrence`` spent in each state, from its item and attempt history."""
    to_receivable = receivable_lag(occurrence)
    to_claim = (
        None
        if to_receivable is None or not attempts
        else attempts[0].started_at - occurrence.available_at - to_receivable
    )
    return StateTimes(
        to_receivable,
        to_claim,
        tuple(a.finished_at - a.started_at for a in attempts if a.finished_at is not None),
        tuple(
            b.started_at - a.finished_at for a, b in pairwise(attempts) if a.finished_at is not None
        ),
    )


def _failures(occurrence: Occurrence, attempts: Sequence[Attempt]) -> list[Failure]:
    found = [
        Failure(
            occurrence.occurrence_id,
            occurrence.scheduled_for,
            a.finished_at if a.finished_at is not None else a.started_at,
            a.outcome.value,
            a.error,
        )
        for a in attempts
        if a.outcome in _FAILED
    ]
    ended_failed = occurrence.state in (OccurrenceState.DEAD, OccurrenceState.MISSED)
    if ended_failed and not (found and found[-1].what == occurrence.state.value):
        # Ended without a failed attempt saying so (MISSED, refused at its claim, expired).
        at = max([occurrence.available_at, *(f.at for f in found)])
        found.append(
            Failure(
                occurrence.occurrence_id,
                occurrence.scheduled_for,
                at,
                occurrence.state.value,
                occurrence.reason,
            )
        )
    return found


def _episode_failure(episode: MissedEpisode) -> Failure:
    return Failure(
        None,
        episode.last,
        episode.last,
        OccurrenceState.MISSED.value,
        f"{episode.count} fires of version {episode.version} recorded MISSED by the misfire policy",
    )


def recent_figures(
    read: Sequence[tuple[Occurrence, Sequence[Attempt]]],
    episodes: Sequence[MissedEpisode],
    unreadable: int = 0,
    *,
    reached: bool = True,
) -> RecentFigures:
    """The figures of the fires ``read`` (their occurrences, with attempts) and of the
    misfire episodes among them: an episode counts when it ends at or after the earliest
    fire read, since its fires have no occurrence to read (a fire recorded MISSED is not
    made, unless a backfill made it later: then it is read, and not counted twice). With
    no fire read, every episode counts if the read ``reached`` the schedule's first item
    (none: it stopped at its bound, the episodes' place among the fires is not known)."""
    since = min((o.scheduled_for for o, _ in read), default=None)
    counted = [e for e in episodes if since is None or e.last >= since] if reached or read else []
    # A fire of an episode made later all the same (a backfill gives it its own id) is read
    # as an occurrence: counted there, not again as missed.
    made = Counter(
        e for e in counted for o, _ in read if e.covers(o.schedule_version, o.scheduled_for)
    )
    unmade = sum(max(0, e.count - made[e]) for e in counted)
    states = [o.state for o, _ in read]
    # The latest failure: by when, then by the later fire, then the later of one fire's.
    failures = [
        ((f.at, f.scheduled_for, n), f)
        for o, attempts in read
        for n, f in enumerate(_failures(o, attempts))
    ]
    failures += [((e.last, e.last, 0), _episode_failure(e)) for e in counted if e.count > made[e]]
    lags = [lag for o, _ in read if (lag := receivable_lag(o)) is not None]
    starts = [lag for o, attempts in read if (lag := start_lag(o, attempts)) is not None]
    return RecentFigures(
        fires=len(read) + unmade,
        since=min([*(e.first for e in counted), *(o.scheduled_for for o, _ in read)], default=None),
        receivable_lag=spread(lags),
        start_lag=spread(starts),
        succeeded=states.count(OccurrenceState.SUCCEEDED),
        retried=sum(1 for o, _ in read if o.attempt_count > 1),
        dead=states.count(OccurrenceState.DEAD),
        missed=states.count(OccurrenceState.MISSED) + unmade,
        skipped=states.count(OccurrenceState.SKIPPED_OVERLAP),
        canceled=states.count(OccurrenceState.CANCELED),
        open=sum(1 for s in states if s in OPEN),
        last_failure=max(failures, key=lambda ranked: ranked[0], default=(None, None))[1],
        unreadable=unreadable,
    )

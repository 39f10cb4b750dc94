"""Drain figures after an outage (docs/operations.md, *Backlog and drain*): how old the
oldest unprocessed due work is, and how long the backlog will take to clear at the rate it
is being processed. Two stages have a backlog of their own:

- **planning** (the materializer): due buckets its shard walks have not reached; they clear
  at the buckets walked per tick minus the one bucket each minute adds;
- **delivery** (workers): occurrences due and not taken by a worker yet; they clear at the
  rate workers take them minus the rate new ones fall due.

Pure arithmetic over what the callers count: the materializer handler (its shard reports),
`punctual stats` (the local tables), and on AWS the dashboard's drain widget
(functions/dashboard/drain.py) over each tenant queue's SQS metrics (``queue_drain``: the
messages waiting over the rate workers delete them less the rate the relay sends them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MINUTE = 60
# A backlog that does not shrink has no drain time; reported as this cap (a day) so that a
# metric and an alarm on it stay numeric.
NOT_DRAINING = 86_400


@dataclass(frozen=True, slots=True)
class Drain:
    """One backlog: its size, the due time of its oldest item (None: empty), how many
    items were processed and fell due per second over the window, and the estimate."""

    backlog: int
    oldest_due: int | None
    processed_per_second: float
    arriving_per_second: float
    drain_seconds: int  # 0: empty; NOT_DRAINING: not shrinking


def estimate(backlog: int, processed: float, arriving: float) -> int:
    """Seconds until ``backlog`` items are gone, processing ``processed`` and receiving
    ``arriving`` items per second (NOT_DRAINING when it does not shrink)."""
    if backlog <= 0:
        return 0
    net = processed - arriving
    if net <= 0:
        return NOT_DRAINING
    # (rounded first: rates are ratios of counts, and 4 / (2 / 300) must be 600, not 601)
    return min(NOT_DRAINING, math.ceil(round(backlog / net, 6)))


def walk_drain(watermarks: Sequence[int], walked: Sequence[int], last_bucket: int) -> Drain:
    """The planning stage after one tick: each shard's watermark (the next minute bucket its
    walk reads) and the buckets it walked in this tick (one tick a minute); ``last_bucket``
    the last one the tick wanted walked. A shard's backlog is its buckets up to
    ``last_bucket`` not walked yet; the slowest shard's drain is the figure (every shard
    must catch up)."""
    behind = [max(0, (last_bucket - mark) // MINUTE + 1) for mark in watermarks]
    return Drain(
        backlog=sum(behind),
        oldest_due=min((m for m, b in zip(watermarks, behind, strict=True) if b), default=None),
        processed_per_second=sum(walked) / MINUTE,
        arriving_per_second=len(watermarks) / MINUTE,
        drain_seconds=max(
            (
                estimate(b, processed=n / MINUTE, arriving=1 / MINUTE)
                for b, n in zip(behind, walked, strict=True)
            ),
            default=0,
        ),
    )


def delivery_drain(
    due: Iterable[tuple[str, int]],
    taken: Iterable[tuple[str, int]],
    fell_due: Iterable[tuple[str, int]],
    *,
    now: int,
    window: int,
) -> tuple[Drain, dict[str, Drain]]:
    """The delivery stage at ``now``: ``due`` the (tenant, due time) of each occurrence due
    and not taken yet, ``taken`` the (tenant, instant) workers took one in the last
    ``window`` seconds, ``fell_due`` the (tenant, due time) of those that fell due in it.
    Overall and per tenant."""
    backlog: dict[str, list[int]] = defaultdict(list)
    for tenant, at in due:
        backlog[tenant].append(at)
    rates: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tenant, at in taken:
        if now - window < at <= now:
            rates[tenant][0] += 1
    for tenant, at in fell_due:
        if now - window < at <= now:
            rates[tenant][1] += 1

    def drain(times: list[int], done: int, arrived: int) -> Drain:
        processed, arriving = done / window, arrived / window
        return Drain(
            backlog=len(times),
            oldest_due=min(times, default=None),
            processed_per_second=processed,
            arriving_per_second=arriving,
            drain_seconds=estimate(len(times), processed, arriving),
        )

    tenants = {
        tenant: drain(backlog.get(tenant, []), *rates.get(tenant, (0, 0)))
        for tenant in backlog.keys() | rates.keys()
    }
    overall = drain(
        [at for times in backlog.values() for at in times],
        sum(r[0] for r in rates.values()),
        sum(r[1] for r in rates.values()),
    )
    return overall, tenants


def largest(tenants: dict[str, Drain], count: int = 5) -> list[tuple[str, Drain]]:
    """The tenants with the largest backlogs (ties: the oldest first), at most ``count``."""
    ranked = sorted(
        ((t, d) for t, d in tenants.items() if d.backlog),
        key=lambda pair: (-pair[1].backlog, pair[1].oldest_due or 0, pair[0]),
    )
    return ranked[:count]


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One SQS queue as CloudWatch measures it: messages waiting (visible), in flight
    (received, not deleted yet) and the age of the oldest (seconds since it was sent) in
    the latest minute; messages deleted (workers done with them) and sent (by the relay,
    and by workers re-queueing a throttled one) over the window."""

    waiting: int = 0
    in_flight: int = 0
    oldest_age: int = 0
    deleted: int = 0
    sent: int = 0


def queue_drain(
    queues: Iterable[tuple[str, QueueFigures]], *, now: int, window: int
) -> tuple[Drain, dict[str, Drain]]:
    """The delivery stage as the tenants' queues show it at ``now``, overall and per
    tenant (a tenant's targets summed): ``queues`` the (tenant, figures) of each queue. The
    backlog is what is waiting or in flight; its oldest due time is ``now`` less the age
    of the oldest message of a queue with a backlog; it drains at the deleted rate less
    the sent rate, each over ``window`` seconds."""
    per_tenant: dict[str, list[QueueFigures]] = defaultdict(list)
    for tenant, figures in queues:
        per_tenant[tenant].append(figures)

    def drain(figures: Sequence[QueueFigures]) -> Drain:
        backlog = sum(f.waiting + f.in_flight for f in figures)
        ages = [f.oldest_age for f in figures if f.waiting + f.in_flight]
        processed = sum(f.deleted for f in figures) / window
        arriving = sum(f.sent for f in figures) / window
        return Drain(
            backlog=backlog,
            oldest_due=now - max(ages) if ages else None,
            processed_per_second=processed,
            arriving_per_second=arriving,
            drain_seconds=estimate(backlog, processed, arriving),
        )

    tenants = {tenant: drain(figures) for tenant, figures in per_tenant.items()}
    return drain([f for figures in per_tenant.values() for f in figures]), tenants

"""`punctual stats`: the operations figures (docs/operations.md) for a local run, read
from the local tables: schedule lag percentiles, occurrences per state, the time in each
state per lane, MISSED, the backlog and its drain time (overall and the largest tenants),
and the reconciler's last window. It scans the tables, which only a local stack can afford."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from punctual.dal.common import UNPARSABLE, from_dynamo
from punctual.dal.occurrences import with_attempts
from punctual.dal.tables import OCCURRENCE_PREFIX, SCHEDULE_CURRENT
from punctual.domain.drain import Drain, delivery_drain, largest
from punctual.domain.figures import receivable_lag, state_times
from punctual.domain.occurrence import Attempt, Lane, Occurrence, OccurrenceState
from punctual.pipeline.reconciler import default_window, read_reports
from punctual.services import Services
from punctual.timing import utc_text


def _scan(services: Services, table: str, sk_prefix: str) -> list[dict[str, Any]]:
    pages = services.dynamodb.get_paginator("scan").paginate(
        TableName=table,
        FilterExpression="begins_with(sk, :sk)",
        ExpressionAttributeValues={":sk": {"S": sk_prefix}},
    )
    return [from_dynamo(item) for page in pages for item in page["Items"]]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


DRAIN_WINDOW = 300  # seconds of processing the drain rate is measured over


def _drain_out(drain: Drain, now: int) -> dict[str, Any]:
    oldest = drain.oldest_due
    return {
        "backlog": drain.backlog,
        "oldest_due": None if oldest is None else utc_text(oldest),
        "oldest_age_seconds": None if oldest is None else max(0, now - oldest),
        "taken_per_minute": round(drain.processed_per_second * 60, 1),
        "due_per_minute": round(drain.arriving_per_second * 60, 1),
        "drain_seconds": drain.drain_seconds,
    }


Read = list[tuple[Occurrence, list[Attempt]]]


def drain_figures(every: Read, now: int) -> dict[str, Any]:
    """The delivery backlog: occurrences due and not taken by a worker yet (SCHEDULED),
    drained at the rate workers took occurrences (attempts started) in the last
    DRAIN_WINDOW seconds, net of those that fell due in it (punctual.domain.drain)."""
    due = [
        (o.tenant_id, o.available_at)
        for o, _ in every
        if o.state is OccurrenceState.SCHEDULED and o.available_at <= now
    ]
    fell_due = [(o.tenant_id, o.available_at) for o, _ in every]
    taken = [(o.tenant_id, attempt.started_at) for o, attempts in every for attempt in attempts]
    overall, tenants = delivery_drain(due, taken, fell_due, now=now, window=DRAIN_WINDOW)
    return _drain_out(overall, now) | {
        "largest_tenants": [
            {"tenant_id": tenant} | _drain_out(drain, now) for tenant, drain in largest(tenants)
        ]
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {f"p{p}": percentile(values, p) for p in (50, 95, 99)} | {"n": len(values)}


def lane_of(occurrence: Occurrence) -> str:
    """strict, flexible (due after its instant: its window's jitter) or catch-up (made
    after its time: the catch-up lane)."""
    if occurrence.lane is Lane.CATCHUP:
        return "catch-up"
    return "strict" if occurrence.available_at == occurrence.scheduled_for else "flexible"


def state_time_figures(occurrences: Read) -> dict[str, Any]:
    """Where the occurrences' time went, per lane: due to receivable, receivable to
    claimed, each run, each retry's wait (seconds: p50, p95, p99 and how many;
    punctual.domain.figures.state_times)."""
    found: dict[str, dict[str, list[float]]] = {}
    for occurrence, attempts in occurrences:
        times = state_times(occurrence, attempts)
        steps = found.setdefault(lane_of(occurrence), {})
        for step, values in (
            ("to_receivable", [times.to_receivable]),
            ("to_claim", [times.to_claim]),
            ("run", list(times.runs)),
            ("retry_wait", list(times.retry_waits)),
        ):
            steps.setdefault(step, []).extend(float(v) for v in values if v is not None)
    return {
        lane: {step: _spread(values) for step, values in steps.items() if values}
        for lane, steps in sorted(found.items())
    }


def _readable(items: list[dict[str, Any]]) -> tuple[Read, int]:
    """Each item's occurrence and attempts, and how many items did not parse (a tenant's
    worker writes the attempt histories: its bad data, counted, never an error)."""
    read: Read = []
    for item in items:
        try:
            read.append(with_attempts(item))
        except UNPARSABLE:
            continue
    return read, len(items) - len(read)


def figures(services: Services, since: int) -> dict[str, Any]:
    settings = services.settings
    now = int(services.now())
    every, unreadable = _readable(_scan(services, settings.occurrences_table, OCCURRENCE_PREFIX))
    occurrences = [(o, attempts) for o, attempts in every if o.scheduled_for >= since]
    lags: dict[str, list[float]] = {"strict": [], "flexible": []}
    for o, _ in occurrences:
        if (lag := receivable_lag(o)) is not None and o.lane is not Lane.CATCHUP:
            # (receivable minus the scheduled instant: a flexible one's window counts)
            lags[lane_of(o)].append(o.available_at + lag - o.scheduled_for)
    # How long each waited for a worker once due (claimed - due), apart from the lag above.
    waits = [
        float(max(0, attempts[0].started_at - o.available_at))
        for o, attempts in occurrences
        if attempts
    ]
    schedules = _scan(services, settings.schedules_table, SCHEDULE_CURRENT)
    start, end = default_window(now)
    reports = read_reports(services, start, end)
    return {
        "occurrences": dict(Counter(o.state.value for o, _ in occurrences)),
        "unreadable": unreadable,
        "lag_seconds": {kind: _spread(values) for kind, values in lags.items() if values},
        "waited_for_a_worker_seconds": _spread(waits) if waits else {},
        "time_in_state_seconds": state_time_figures(occurrences),
        "schedules": dict(Counter(str(s["state"]) for s in schedules)),
        "missed_summarized": sum(int(s.get("missed_total", 0)) for s in schedules),
        "drain": drain_figures(every, now),
        "reconcile": {
            "window_start": start,
            "window_end": end,
            "shards_reported": len(reports),
            "missing": sum(r.missing for r in reports),
            "unexpected": sum(r.unexpected for r in reports),
        },
    }

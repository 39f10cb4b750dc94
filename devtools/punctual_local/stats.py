"""`punctual stats`: the operations figures (docs/operations.md) for a local run, read
from the local tables: schedule lag percentiles, occurrences per state, MISSED, the
backlog and its drain time (overall and the largest tenants), and the reconciler's last
window. It scans the tables, which only a local stack can afford."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from punctual.dal.common import from_dynamo
from punctual.dal.occurrences import first_claim
from punctual.dal.tables import OCCURRENCE_PREFIX, SCHEDULE_CURRENT
from punctual.domain.drain import Drain, delivery_drain, largest
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


def drain_figures(every: list[dict[str, Any]], now: int) -> dict[str, Any]:
    """The delivery backlog: occurrences due and not taken by a worker yet (SCHEDULED),
    drained at the rate workers took occurrences (attempts started) in the last
    DRAIN_WINDOW seconds, net of those that fell due in it (punctual.domain.drain)."""
    due = [
        (str(o["tenant_id"]), int(o["available_at"]))
        for o in every
        if o["state"] == "SCHEDULED" and int(o["available_at"]) <= now
    ]
    fell_due = [(str(o["tenant_id"]), int(o["available_at"])) for o in every]
    taken = [
        (str(o["tenant_id"]), int(attempt["started_at"]))
        for o in every
        for attempt in o.get("attempts") or ()
    ]
    overall, tenants = delivery_drain(due, taken, fell_due, now=now, window=DRAIN_WINDOW)
    return _drain_out(overall, now) | {
        "largest_tenants": [
            {"tenant_id": tenant} | _drain_out(drain, now) for tenant, drain in largest(tenants)
        ]
    }


def figures(services: Services, since: int) -> dict[str, Any]:
    settings = services.settings
    now = int(services.now())
    every = _scan(services, settings.occurrences_table, OCCURRENCE_PREFIX)
    occurrences = [o for o in every if int(o["scheduled_for"]) >= since]
    lags: dict[str, list[float]] = {"strict": [], "flexible": []}
    for o in occurrences:
        if o.get("enqueued_at") is None:
            continue
        # Receivable when sent, or at available_at if it was sent ahead with a delay.
        receivable = max(int(o["enqueued_at"]), int(o["available_at"]))
        kind = "strict" if o["available_at"] == o["scheduled_for"] else "flexible"
        lags[kind].append(receivable - int(o["scheduled_for"]))
    # How long each waited for a worker once due (claimed - due), apart from the lag above.
    waits = [
        float(max(0, claimed - int(o["available_at"])))
        for o in occurrences
        if (claimed := first_claim(o)) is not None
    ]
    schedules = _scan(services, settings.schedules_table, SCHEDULE_CURRENT)
    start, end = default_window(now)
    reports = read_reports(services, start, end)
    return {
        "occurrences": dict(Counter(str(o["state"]) for o in occurrences)),
        "lag_seconds": {
            kind: {f"p{p}": percentile(values, p) for p in (50, 95, 99)} | {"n": len(values)}
            for kind, values in lags.items()
            if values
        },
        "waited_for_a_worker_seconds": (
            {f"p{p}": percentile(waits, p) for p in (50, 95, 99)} | {"n": len(waits)}
            if waits
            else {}
        ),
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

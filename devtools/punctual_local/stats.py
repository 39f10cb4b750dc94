"""`punctual stats`: the operations figures (docs/operations.md) for a local run, read
from the local tables: schedule lag percentiles, occurrences per state, MISSED, and the
reconciler's last window. It scans the tables, which only a local stack can afford."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from punctual.dal.common import from_dynamo
from punctual.dal.tables import OCCURRENCE_PREFIX, SCHEDULE_CURRENT
from punctual.reconciler import default_window, read_reports
from punctual.services import Services


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


def figures(services: Services, since: int) -> dict[str, Any]:
    settings = services.settings
    occurrences = [
        o
        for o in _scan(services, settings.occurrences_table, OCCURRENCE_PREFIX)
        if int(o["scheduled_for"]) >= since
    ]
    lags: dict[str, list[float]] = {"strict": [], "flexible": []}
    for o in occurrences:
        if o.get("enqueued_at") is None:
            continue
        # Receivable when sent, or at available_at if it was sent ahead with a delay.
        receivable = max(int(o["enqueued_at"]), int(o["available_at"]))
        kind = "strict" if o["available_at"] == o["scheduled_for"] else "flexible"
        lags[kind].append(receivable - int(o["scheduled_for"]))
    schedules = _scan(services, settings.schedules_table, SCHEDULE_CURRENT)
    start, end = default_window(int(services.now()))
    reports = read_reports(services, start, end)
    return {
        "occurrences": dict(Counter(str(o["state"]) for o in occurrences)),
        "lag_seconds": {
            kind: {f"p{p}": percentile(values, p) for p in (50, 95, 99)} | {"n": len(values)}
            for kind, values in lags.items()
            if values
        },
        "schedules": dict(Counter(str(s["state"]) for s in schedules)),
        "missed_summarized": sum(int(s.get("missed_total", 0)) for s in schedules),
        "reconcile": {
            "window_start": start,
            "window_end": end,
            "shards_reported": len(reports),
            "missing": sum(r.missing for r in reports),
            "unexpected": sum(r.unexpected for r in reports),
        },
    }

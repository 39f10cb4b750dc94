"""The tenants' queues as CloudWatch measures them, for the dashboard's drain widget
(functions/relay/drain.py, docs/operations.md *Backlog and drain*).

One Metrics Insights query per figure (GetMetricData runs one per call), each over every
queue's ``AWS/SQS`` metric grouped by queue and ordered by that figure, the largest
``LIMIT`` of them; joined by queue name here, which CloudWatch's metric math cannot do
across a query's results. Of a grouped query's results, each time series' ``Label`` is the
group's ``QueueName``. Queues that are not a tenant's main queue (the DLQs, other
applications' queues) are left out: what waits in a DLQ is not being processed.

Cost: each call is billed by the metrics it analyzes (every SQS queue of the region, four
times per render of the widget), so the widget is rendered on demand, not on a schedule.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from punctual.drain import QueueFigures
from punctual.integrations.queues import queue_owner

MINUTE = 60
# Metrics Insights returns at most 500 time series per query.
LIMIT = 500
# QueueFigures field -> (Metrics Insights function, SQS metric, how a field reads the
# minutes: the newest one for a gauge, their sum for a count).
QUERIES: dict[str, tuple[str, str, bool]] = {
    "waiting": ("MAX", "ApproximateNumberOfMessagesVisible", False),
    "oldest_age": ("MAX", "ApproximateAgeOfOldestMessage", False),
    "deleted": ("SUM", "NumberOfMessagesDeleted", True),
    "sent": ("SUM", "NumberOfMessagesSent", True),
}


def insights_query(function: str, metric: str) -> str:
    return (
        f'SELECT {function}({metric}) FROM SCHEMA("AWS/SQS", QueueName) '
        f"GROUP BY QueueName ORDER BY {function}() DESC LIMIT {LIMIT}"
    )


class QueueMetrics:
    def __init__(self, cloudwatch: Any, prefix: str) -> None:
        self._cloudwatch = cloudwatch
        self._prefix = prefix

    def tenant_queues(self, *, now: int, window: int) -> list[tuple[str, QueueFigures]]:
        """(tenant, figures) of every tenant main queue among each figure's largest, over
        the ``window`` seconds of whole minutes before ``now`` (SQS publishes a datapoint a
        minute; the minute under way has none yet)."""
        end = now - now % MINUTE
        per_queue: dict[str, dict[str, int]] = {}
        for field, (function, metric, summed) in QUERIES.items():
            for name, values in self._series(insights_query(function, metric), end - window, end):
                # (values newest first: ScanBy=TimestampDescending)
                value = sum(values) if summed else values[0]
                per_queue.setdefault(name, {})[field] = round(value)
        found = []
        for name, figures in sorted(per_queue.items()):
            owner = queue_owner(self._prefix, name)
            if owner is not None and not owner[2]:
                found.append((owner[0], QueueFigures(**figures)))
        return found

    def _series(self, expression: str, start: int, end: int) -> list[tuple[str, list[float]]]:
        """(label, values newest first) of each time series with values (a series may
        continue on the next page)."""
        series: dict[str, list[float]] = {}
        paginator = self._cloudwatch.get_paginator("get_metric_data")
        for page in paginator.paginate(
            MetricDataQueries=[{"Id": "q", "Expression": expression, "Period": MINUTE}],
            StartTime=datetime.fromtimestamp(start, UTC),
            EndTime=datetime.fromtimestamp(end, UTC),
            ScanBy="TimestampDescending",
        ):
            for result in page["MetricDataResults"]:
                series.setdefault(result["Label"], []).extend(result["Values"])
        return [(label, values) for label, values in series.items() if values]

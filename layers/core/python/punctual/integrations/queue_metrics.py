"""The tenants' queues as CloudWatch measures them, for the dashboard's drain widget
(functions/dashboard/drain.py, docs/operations.md *Backlog and drain*).

Two reads over a window of whole minutes:

- ``survey``: one Metrics Insights query per figure (GetMetricData runs one per call), each
  over every queue's ``AWS/SQS`` metric grouped by queue and ordered by that figure, the
  largest ``LIMIT`` of them; joined by queue name here, which CloudWatch's metric math
  cannot do across a query's results. A grouped series' ``Label`` is its ``QueueName``. A
  queue outside a figure's largest counts 0 for it (small next to those inside), and
  Metrics Insights reads at most 10,000 metrics per query: past ~5,000 targets in a region
  the survey is partial. Good for sums over all tenants.
- ``exact``: the figures of named queues (the largest tenants'), each metric read by
  name (MetricStat): what the widget shows per tenant, whatever crowds the survey's lists
  (the DLQs' old messages fill the age query's 500).

Queues that are not a tenant's main queue (the DLQs, other applications' queues) are left
out: what waits in a DLQ is not being processed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from punctual.domain.drain import QueueFigures
from punctual.integrations.queues import queue_owner

MINUTE = 60
# Metrics Insights returns at most 500 time series per query.
LIMIT = 500
# GetMetricData takes at most 500 queries per call.
MAX_QUERIES = 500
# QueueFigures field -> (statistic, SQS metric, how a field reads the minutes: the newest
# one for a gauge, their sum for a count).
QUERIES: dict[str, tuple[str, str, bool]] = {
    "waiting": ("Maximum", "ApproximateNumberOfMessagesVisible", False),
    "in_flight": ("Maximum", "ApproximateNumberOfMessagesNotVisible", False),
    "oldest_age": ("Maximum", "ApproximateAgeOfOldestMessage", False),
    "deleted": ("Sum", "NumberOfMessagesDeleted", True),
    "sent": ("Sum", "NumberOfMessagesSent", True),
}
_INSIGHTS = {"Maximum": "MAX", "Sum": "SUM"}
# A result CloudWatch could not compute (PartialData only means: more on the next page).
FAILED = ("InternalError", "Forbidden")


class MetricsUnavailable(Exception):
    """CloudWatch answered a query with an error instead of data."""


def insights_query(statistic: str, metric: str) -> str:
    function = _INSIGHTS[statistic]
    return (
        f'SELECT {function}({metric}) FROM SCHEMA("AWS/SQS", QueueName) '
        f"GROUP BY QueueName ORDER BY {function}() DESC LIMIT {LIMIT}"
    )


def _value(values: list[float], summed: bool) -> int:
    # (values newest first: ScanBy=TimestampDescending)
    return round(sum(values) if summed else values[0])


def metric_queries(names: list[str]) -> list[dict[str, Any]]:
    """A MetricStat query per figure of each queue, Id ``q<index of its name>_<figure>``."""
    return [
        {
            "Id": f"q{n}_{field}",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/SQS",
                    "MetricName": metric,
                    "Dimensions": [{"Name": "QueueName", "Value": name}],
                },
                "Period": MINUTE,
                "Stat": statistic,
            },
        }
        for n, name in enumerate(names)
        for field, (statistic, metric, _) in QUERIES.items()
    ]


class QueueMetrics:
    def __init__(self, cloudwatch: Any, prefix: str) -> None:
        self._cloudwatch = cloudwatch
        self._prefix = prefix

    def survey(self, start: int, end: int) -> dict[tuple[str, str], QueueFigures]:
        """Every tenant main queue among each figure's largest over [start, end), by
        (tenant, queue name)."""
        per_queue: dict[tuple[str, str], dict[str, int]] = {}
        for field, (statistic, metric, summed) in QUERIES.items():
            query = {"Id": "q", "Expression": insights_query(statistic, metric), "Period": MINUTE}
            for name, values in self._series([query], start, end):
                owner = queue_owner(self._prefix, name)
                if owner is not None and not owner[2]:  # a tenant's main queue
                    per_queue.setdefault((owner[0], name), {})[field] = _value(values, summed)
        return {key: QueueFigures(**figures) for key, figures in per_queue.items()}

    def exact(self, names: Iterable[str], start: int, end: int) -> dict[str, QueueFigures]:
        """The figures of these queues over [start, end), each metric read by name (a
        metric with no datapoint, as of an idle queue, counts 0)."""
        names = sorted(set(names))
        queries = metric_queries(names)
        figures: dict[str, dict[str, int]] = {name: {} for name in names}
        for first in range(0, len(queries), MAX_QUERIES):
            chunk = queries[first : first + MAX_QUERIES]
            for key, values in self._series(chunk, start, end, by="Id"):
                n, field = key[1:].split("_", 1)
                figures[names[int(n)]][field] = _value(values, QUERIES[field][2])
        return {name: QueueFigures(**found) for name, found in figures.items()}

    def _series(
        self, queries: list[dict[str, Any]], start: int, end: int, by: str = "Label"
    ) -> Iterator[tuple[str, list[float]]]:
        """(the result's ``by``, values newest first) of each series with values (a
        series may continue on the next page)."""
        series: dict[str, list[float]] = {}
        paginator = self._cloudwatch.get_paginator("get_metric_data")
        for page in paginator.paginate(
            MetricDataQueries=queries,
            StartTime=datetime.fromtimestamp(start, UTC),
            EndTime=datetime.fromtimestamp(end, UTC),
            ScanBy="TimestampDescending",
        ):
            for result in page["MetricDataResults"]:
                if result.get("StatusCode") in FAILED:
                    messages = "; ".join(m.get("Value", "") for m in result.get("Messages", []))
                    raise MetricsUnavailable(f"CloudWatch: {result['StatusCode']} {messages}")
                series.setdefault(result[by], []).extend(result["Values"])
        return ((key, values) for key, values in series.items() if values)

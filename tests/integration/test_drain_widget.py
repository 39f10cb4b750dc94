"""The dashboard's drain widget (functions/relay/drain.py): the tenants' delivery backlog
and drain time, overall and for the largest tenants, from their queues' SQS metrics.

moto's CloudWatch does not run Metrics Insights queries (no GROUP BY, no labels), so
CloudWatch is botocore's Stubber: it checks each request against the API's model and the
expected parameters, and answers as CloudWatch does (one series per queue, labelled with
its QueueName). The queues are the ones the API made for real tenants."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from relay import drain as widget

from punctual.drain import QueueFigures
from punctual.integrations.queue_metrics import LIMIT, QUERIES, QueueMetrics
from punctual.services import Services
from punctual.timing import utc_text
from tests.integration.conftest import Api, LambdaContextStub, bootstrap

M = 60
# Each figure, minute by minute, newest first, for each queue (by tenant and role).
Series = dict[str, list[float]]


def _queues(aws: Services) -> dict[tuple[str, str], str]:
    """(tenant, "queue" | "dlq") -> the queue's name, as the API made them."""
    names = {}
    for url in aws.sqs.list_queues()["QueueUrls"]:
        tags = aws.sqs.list_queue_tags(QueueUrl=url)["Tags"]
        names[(tags["punctual:tenant"], tags["punctual:role"])] = url.rsplit("/", 1)[-1]
    return names


@pytest.fixture
def cloudwatch(aws: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    client = boto3.client("cloudwatch", region_name="us-east-1")
    stubber = Stubber(client)
    monkeypatch.setattr(
        widget, "_metrics", lambda services: QueueMetrics(client, services.settings.queue_prefix)
    )
    widget.configure(aws)
    with stubber:
        yield stubber
    widget.configure(None)
    stubber.assert_no_pending_responses()


def expect(stubber: Stubber, end: int, answers: dict[str, list[tuple[str, list[float]]]]) -> None:
    """The four queries the widget makes, in order, over the five whole minutes before
    ``end``; each answered with (label, values newest first) per series, the last series
    of each answer split over two pages as CloudWatch may."""
    for field, (function, metric, _) in QUERIES.items():
        series = answers.get(field, [])
        query = {
            "MetricDataQueries": [
                {
                    "Id": "q",
                    "Expression": (
                        f'SELECT {function}({metric}) FROM SCHEMA("AWS/SQS", QueueName) '
                        f"GROUP BY QueueName ORDER BY {function}() DESC LIMIT {LIMIT}"
                    ),
                    "Period": M,
                }
            ],
            "StartTime": datetime.fromtimestamp(end - 300, UTC),
            "EndTime": datetime.fromtimestamp(end, UTC),
            "ScanBy": "TimestampDescending",
        }

        def result(label: str, values: list[float], offset: int = 0) -> dict[str, Any]:
            times = [
                datetime.fromtimestamp(end - (offset + i + 1) * M, UTC) for i in range(len(values))
            ]
            return {
                "Id": "q",
                "Label": label,
                "Timestamps": times,
                "Values": values,
                "StatusCode": "Complete",
            }

        if not series:
            stubber.add_response("get_metric_data", {"MetricDataResults": []}, query)
            continue
        *whole, (label, values) = series
        first = [result(name, v) for name, v in whole] + [result(label, values[:1])]
        stubber.add_response(
            "get_metric_data", {"MetricDataResults": first, "NextToken": "page-2"}, query
        )
        stubber.add_response(
            "get_metric_data",
            {"MetricDataResults": [result(label, values[1:], offset=1)]},
            {**query, "NextToken": "page-2"},
        )


def cells(html: str) -> list[list[str]]:
    rows = html.split("<tr>")[2:]
    return [[c.split("</td>")[0] for c in row.split("<td>")[1:]] for row in rows]


def test_drain_widget_shows_every_tenants_backlog_and_the_largest_ones_drain_time(
    alice: Api, aws: Services, cloudwatch: Stubber
):
    # GIVEN two tenants with a target each (a queue and its DLQ), and another application's
    # queue in the account
    bootstrap("bob", "arn:aws:iam::111122223333:role/bob")
    names = _queues(aws)
    a, a_dlq, b = names[("alice", "queue")], names[("alice", "dlq")], names[("bob", "queue")]
    now = int(aws.now())
    end = now - now % M
    # AND their figures over the last five minutes: alice 600 waiting, the oldest sent 20
    # minutes ago, 300 deleted and 60 sent (1 net a second); bob 10 waiting, workers gone;
    # alice's DLQ holds 50 dead messages; the foreign queue has 999 waiting
    expect(
        cloudwatch,
        end,
        {
            "waiting": [
                ("other-app-queue", [999, 999]),
                (a, [600, 640, 700]),
                (a_dlq, [50]),
                (b, [10, 8]),
            ],
            "oldest_age": [(a, [1200, 1140]), (b, [90]), (a_dlq, [86_400])],
            "deleted": [(a, [60, 60, 60, 60, 60]), (a_dlq, [5])],
            "sent": [(b, [4, 4]), (a, [12, 12, 12, 12, 12])],
        },
    )
    # WHEN the dashboard renders the widget
    html = widget.lambda_handler({"widgetContext": {}}, LambdaContextStub())  # type: ignore[arg-type]
    # THEN a row for all tenants, then the tenants by messages waiting; the DLQ and the
    # other application's queue count nowhere
    rows = cells(html)
    assert [row[0] for row in rows] == ["all tenants", "alice", "bob"]
    total, first, second = rows
    assert first[1:] == [
        "600",
        f"{utc_text(now - 1200)} (20 min 00 s ago)",
        "60.0",  # deleted per minute
        "12.0",  # sent per minute
        "12 min 30 s",  # 600 at 0.8 net a second (1.0 deleted - 0.2 sent): 750 s
    ]
    assert second[1:] == [
        "10",
        f"{utc_text(now - 90)} (1 min 30 s ago)",
        "0.0",
        "1.6",
        "not draining",
    ]
    assert total[1:] == [
        "610",
        f"{utc_text(now - 1200)} (20 min 00 s ago)",
        "60.0",
        "13.6",
        "13 min 09 s",  # 610 / (1.0 - 68 / 300 a second) = 788.8 s, rounded up
    ]


def test_drain_widget_with_nothing_waiting_says_empty(aws: Services, cloudwatch: Stubber):
    now = int(aws.now())
    expect(cloudwatch, now - now % M, {})
    html = widget.lambda_handler({}, LambdaContextStub())  # type: ignore[arg-type]
    assert cells(html) == [["all tenants", "0", "-", "0.0", "0.0", "empty"]]


def test_drain_widget_over_a_past_time_range_shows_the_backlog_as_it_was(
    alice: Api, aws: Services, cloudwatch: Stubber
):
    # GIVEN the dashboard's time range ends two hours ago (an outage looked back at)
    now = int(aws.now())
    then = now - 7200 - 17
    a = _queues(aws)[("alice", "queue")]
    # THEN the queries end at the last whole minute before then, the ages count from then
    expect(cloudwatch, then - then % M, {"waiting": [(a, [5])], "oldest_age": [(a, [30])]})
    event = {"widgetContext": {"timeRange": {"start": 0, "end": then * 1000 + 999}}}
    html = widget.lambda_handler(event, LambdaContextStub())  # type: ignore[arg-type]
    assert cells(html)[1][:3] == ["alice", "5", f"{utc_text(then - 30)} (30 s ago)"]
    assert f"as of {utc_text(then)}" in html


def test_drain_widget_queries_every_figure_of_a_queue():
    assert set(QUERIES) == {f.name for f in fields(QueueFigures)}


def test_drain_widget_describes_itself_without_reading_metrics(cloudwatch: Stubber):
    # WHEN the console asks the widget for its documentation: no query is made
    text = widget.lambda_handler({"describe": True}, LambdaContextStub())  # type: ignore[arg-type]
    assert "waiting / (deleted - sent)" in text

"""The dashboard's drain widget (functions/dashboard/drain.py): the tenants' delivery backlog
and drain time, overall and for the largest tenants, from their queues' SQS metrics: a
survey of every queue (Metrics Insights), then the largest tenants' queues read by name.

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
from dashboard import drain as widget

from punctual.domain.drain import QueueFigures
from punctual.integrations.queue_metrics import (
    LIMIT,
    QUERIES,
    MetricsUnavailable,
    QueueMetrics,
    insights_query,
    metric_queries,
)
from punctual.integrations.queues import queue_name
from punctual.services import Services
from punctual.timing import utc_text
from tests.integration.conftest import Api, LambdaContextStub, bootstrap

M = 60


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


def _window(aws: Services) -> int:
    """The end of the widget's window: whole minutes, CloudWatch's last two left out."""
    now = int(aws.now())
    return now - now % M - 120


def _times(end: int, count: int, offset: int = 0) -> list[datetime]:
    return [datetime.fromtimestamp(end - (offset + i + 1) * M, UTC) for i in range(count)]


def _span(end: int) -> dict[str, Any]:
    return {
        "StartTime": datetime.fromtimestamp(end - 300, UTC),
        "EndTime": datetime.fromtimestamp(end, UTC),
        "ScanBy": "TimestampDescending",
    }


def expect_survey(
    stubber: Stubber, end: int, answers: dict[str, list[tuple[str, list[float]]]]
) -> None:
    """The survey's queries, one per figure in order, over the five minutes before ``end``;
    each answered with (label, values newest first) per series, the last series of each
    answer split over two pages as CloudWatch may."""
    for field, (statistic, metric, _) in QUERIES.items():
        function = {"Maximum": "MAX", "Sum": "SUM"}[statistic]
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
            **_span(end),
        }

        def result(label: str, values: list[float], offset: int = 0) -> dict[str, Any]:
            return {
                "Id": "q",
                "Label": label,
                "Timestamps": _times(end, len(values), offset),
                "Values": values,
                "StatusCode": "Complete",
            }

        if not series:
            stubber.add_response("get_metric_data", {"MetricDataResults": []}, query)
            continue
        *whole, (label, values) = series
        first = [result(name, v) for name, v in whole] + [result(label, values[:1])]
        stubber.add_response(
            "get_metric_data",
            {"MetricDataResults": first, "NextToken": "page-2"},
            query,
        )
        stubber.add_response(
            "get_metric_data",
            {"MetricDataResults": [result(label, values[1:], offset=1)]},
            {**query, "NextToken": "page-2"},
        )


def expect_exact(stubber: Stubber, end: int, answers: dict[str, dict[str, list[float]]]) -> None:
    """The read by name of these queues' figures (values newest first; a figure left out
    has no datapoint)."""
    names = sorted(answers)
    # (the request as the module spells it; the Stubber checks it against CloudWatch's model,
    # and the answers below are matched by Id)
    queries = metric_queries(names)
    results = [
        {
            "Id": f"q{n}_{field}",
            "Label": field,
            "Timestamps": _times(end, len(values)),
            "Values": values,
            "StatusCode": "Complete",
        }
        for n, name in enumerate(names)
        for field, values in answers[name].items()
    ]
    stubber.add_response(
        "get_metric_data",
        {"MetricDataResults": results},
        {"MetricDataQueries": queries, **_span(end)},
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
    end = _window(aws)
    # AND the survey over all queues: the DLQ's and the other queue's figures among them;
    # the age query's largest crowded by old DLQ messages (alice and bob not in it)
    expect_survey(
        cloudwatch,
        end,
        {
            "waiting": [("other-app-queue", [999, 999]), (a, [590]), (a_dlq, [50]), (b, [10])],
            "in_flight": [(a, [30])],
            "oldest_age": [(a_dlq, [86_400]), ("other-app-queue", [3_600, 3_540])],
            "deleted": [(a, [60, 60, 60, 60, 50]), (a_dlq, [5])],
            "sent": [(b, [4, 4]), (a, [12, 12, 12, 12, 12])],
        },
    )
    # AND, read by name, the two tenants' queues: alice 600 waiting and 40 in flight, the
    # oldest sent 20 minutes before, 300 deleted and 60 sent (0.8 net a second); bob 10
    # waiting, its workers gone
    expect_exact(
        cloudwatch,
        end,
        {
            a: {
                "waiting": [600, 640],
                "in_flight": [40, 35],
                "oldest_age": [1200, 1140],
                "deleted": [60, 60, 60, 60, 60],
                "sent": [12, 12, 12, 12, 12],
            },
            b: {"waiting": [10, 8], "oldest_age": [90], "sent": [4, 4]},
        },
    )
    # WHEN the dashboard renders the widget
    html = widget.lambda_handler({"widgetContext": {}}, LambdaContextStub())  # type: ignore[arg-type]
    # THEN a row for all tenants, then the tenants by backlog, each from its exact figures;
    # the DLQ and the other application's queue count nowhere
    rows = cells(html)
    assert [row[0] for row in rows] == ["all tenants", "alice", "bob"]
    total, first, second = rows
    assert first[1:] == [
        "640",
        f"{utc_text(end - 1200)} (20 min 00 s old)",
        "60.0",  # deleted per minute
        "12.0",  # sent per minute
        "13 min 20 s",  # 640 at 0.8 net a second (1.0 deleted - 0.2 sent): 800 s
    ]
    assert second[1:] == [
        "10",
        f"{utc_text(end - 90)} (1 min 30 s old)",
        "0.0",
        "1.6",
        "not draining",
    ]
    assert total[1:] == [
        "650",
        f"{utc_text(end - 1200)} (20 min 00 s old)",
        "60.0",
        "13.6",
        "14 min 01 s",  # 650 / (1.0 - 68 / 300 a second) = 840.5 s, rounded up
    ]
    assert f"as of {utc_text(end)}" in html


def test_drain_widget_reads_by_name_the_five_largest_tenants_only(
    aws: Services, cloudwatch: Stubber
):
    # GIVEN seven tenants' queues in the survey, t1 with 1 message waiting ... t7 with 7
    end = _window(aws)
    queues = {i: queue_name(aws.settings.queue_prefix, f"t{i}", "jobs") for i in range(1, 8)}
    expect_survey(
        cloudwatch,
        end,
        {
            "waiting": [(queues[i], [i]) for i in range(7, 0, -1)],
            "deleted": [(queues[i], [1]) for i in range(1, 8)],
        },
    )
    # THEN t3 to t7 are read by name, and their rows take those figures (t7 now drained:
    # no row); t1 and t2 count in the total as surveyed, with no row
    expect_exact(
        cloudwatch, end, {queues[i]: {"waiting": [0 if i == 7 else i]} for i in range(3, 8)}
    )
    rows = cells(widget.lambda_handler({}, LambdaContextStub()))  # type: ignore[arg-type]
    assert [(row[0], row[1]) for row in rows] == [
        ("all tenants", str(1 + 2 + 3 + 4 + 5 + 6)),
        ("t6", "6"),
        ("t5", "5"),
        ("t4", "4"),
        ("t3", "3"),
    ]


def test_drain_widget_tells_a_slow_drain_from_none(aws: Services, cloudwatch: Stubber):
    # GIVEN a queue of 100,000 deleted 1 a minute faster than they arrive (days to clear)
    end = _window(aws)
    q = queue_name(aws.settings.queue_prefix, "slow", "jobs")
    expect_survey(cloudwatch, end, {"waiting": [(q, [100_000])]})
    expect_exact(
        cloudwatch,
        end,
        {
            q: {
                "waiting": [100_000],
                "oldest_age": [3 * 86_400 + 7200 + 60],
                "deleted": [301],
                "sent": [300],
            }
        },
    )
    rows = cells(widget.lambda_handler({}, LambdaContextStub()))  # type: ignore[arg-type]
    # THEN it says over a day, not "not draining"; the age in hours
    assert rows[1][2].endswith("(74 h 01 min old)")
    assert rows[1][5] == "over a day"


def test_drain_widget_with_no_metrics_says_so(aws: Services, cloudwatch: Stubber):
    expect_survey(cloudwatch, _window(aws), {})
    html = widget.lambda_handler({}, LambdaContextStub())  # type: ignore[arg-type]
    assert cells(html) == [["all tenants", "0", "-", "0.0", "0.0", "empty"]]
    assert "No SQS metrics of a tenant queue in this time range." in html


def test_drain_widget_fails_when_cloudwatch_could_not_answer(aws: Services, cloudwatch: Stubber):
    # GIVEN CloudWatch answers the first query with an error status instead of data
    end = _window(aws)
    (statistic, metric, _) = QUERIES["waiting"]
    cloudwatch.add_response(
        "get_metric_data",
        {
            "MetricDataResults": [
                {"Id": "q", "Label": "q", "StatusCode": "Forbidden", "Values": []}
            ],
            "Messages": [],
        },
        {
            "MetricDataQueries": [
                {"Id": "q", "Expression": insights_query(statistic, metric), "Period": M}
            ],
            **_span(end),
        },
    )
    # THEN the widget fails with CloudWatch's status (shown in the widget), not an empty table
    with pytest.raises(MetricsUnavailable, match="Forbidden"):
        widget.lambda_handler({}, LambdaContextStub())  # type: ignore[arg-type]


def test_drain_widget_over_a_past_time_range_shows_the_backlog_as_it_was(
    alice: Api, aws: Services, cloudwatch: Stubber
):
    # GIVEN the dashboard's time range ends two hours ago (an outage looked back at)
    then = int(aws.now()) - 7200 - 17
    end = then - then % M - 120
    a = _queues(aws)[("alice", "queue")]
    # THEN the window ends by then, and the figures are those of then
    expect_survey(cloudwatch, end, {"waiting": [(a, [5])]})
    expect_exact(cloudwatch, end, {a: {"waiting": [5], "oldest_age": [30]}})
    event = {"widgetContext": {"timeRange": {"start": 0, "end": then * 1000 + 999}}}
    html = widget.lambda_handler(event, LambdaContextStub())  # type: ignore[arg-type]
    assert cells(html)[1][:3] == ["alice", "5", f"{utc_text(end - 30)} (30 s old)"]
    assert f"as of {utc_text(end)}" in html


def test_drain_widget_queries_every_figure_of_a_queue():
    assert set(QUERIES) == {f.name for f in fields(QueueFigures)}
    # AND a queue read by name is read in SQS's namespace, by its QueueName, per minute
    found = {
        (q["Id"], stat["Metric"]["MetricName"], stat["Stat"])
        for q in metric_queries(["a", "b"])
        for stat in [q["MetricStat"]]
        if stat["Metric"]["Namespace"] == "AWS/SQS"
        and stat["Period"] == M
        and stat["Metric"]["Dimensions"] == [{"Name": "QueueName", "Value": "ab"[int(q["Id"][1])]}]
    }
    assert found == {
        (f"q{n}_{field}", metric, statistic)
        for n in (0, 1)
        for field, (statistic, metric, _) in QUERIES.items()
    }


def test_drain_widget_describes_itself_without_reading_metrics(cloudwatch: Stubber):
    # WHEN the console asks the widget for its documentation: no query is made
    text = widget.lambda_handler({"describe": True}, LambdaContextStub())  # type: ignore[arg-type]
    assert "backlog / (deleted - sent)" in text

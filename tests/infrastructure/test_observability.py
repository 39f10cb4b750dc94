"""The dashboard and the alarms, with thresholds from the deployment's context."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match, Template

from infra.observability import DIMENSIONS, NAMESPACE
from punctual.dal.tables import ALL_TABLES

from .conftest import render


def _alarm(template: Template, name_part: str) -> dict[str, Any]:
    found = {
        k: v for k, v in template.find_resources("AWS::CloudWatch::Alarm").items() if name_part in k
    }
    assert len(found) == 1, f"one alarm named like {name_part}: {list(found)}"
    return dict(next(iter(found.values()))["Properties"])


def test_observability_every_alarm_notifies_the_topic_both_ways(service: Template):
    # THEN there is one SNS topic, TLS only, with the configured e-mail subscription
    topics = service.find_resources("AWS::SNS::Topic")
    assert len(topics) == 1
    topic = next(iter(topics))
    service.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"}
    )
    # AND every alarm tells it when it fires and when it recovers
    alarms = service.find_resources("AWS::CloudWatch::Alarm")
    assert len(alarms) == 22 + len(ALL_TABLES)
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic}]
        assert alarm["Properties"]["OKActions"] == [{"Ref": topic}]
        # (no data is healthy, but for the heartbeats: no tick, no hourly run is what
        # they exist for)
        heartbeat = alarm["Properties"]["AlarmName"].endswith(
            ("MaterializerStopped", "ReconcilerStopped")
        )
        assert alarm["Properties"]["TreatMissingData"] == (
            "breaching" if heartbeat else "notBreaching"
        )


def test_observability_clock_skew_alarm_fires_on_a_clock_off_for_three_minutes(
    service: Template,
):
    # GIVEN clock_skew_seconds = 0.5 in the test context
    alarm = _alarm(service, "ClockSkew")
    # THEN it watches the largest skew any component published, per minute, 3 of 3 minutes
    # (a clock stays off: not a minute's outlier), and none published is healthy
    assert (alarm["Namespace"], alarm["MetricName"]) == (NAMESPACE, "ClockSkew")
    assert alarm["Dimensions"] == [{"Name": k, "Value": v} for k, v in DIMENSIONS.items()]
    assert (alarm["Statistic"], alarm["Period"], alarm["Threshold"]) == ("Maximum", 60, 0.5)
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (3, 3)
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"


def test_observability_strict_lag_alarm_is_the_slo_on_p99(service: Template):
    # GIVEN strict_lag_p99_seconds = 4 in the test context
    alarm = _alarm(service, "StrictLagP99")
    # THEN it watches the p99 of the relay's strict lag metric, per minute, 2 of 3 minutes
    assert alarm["Namespace"] == NAMESPACE
    assert alarm["MetricName"] == "EnqueueLagStrict"
    assert alarm["Dimensions"] == [{"Name": k, "Value": v} for k, v in DIMENSIONS.items()]
    assert alarm["ExtendedStatistic"] == "p99"
    assert alarm["Period"] == 60
    assert alarm["Threshold"] == 4
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (3, 2)
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"


def test_observability_alarm_thresholds_come_from_the_context(service: Template):
    # GIVEN the thresholds of the test context
    # THEN each alarm compares against its configured value (iterator age in ms)
    assert _alarm(service, "StreamIteratorAge")["Threshold"] == 45_000
    assert _alarm(service, "StreamIteratorAge")["MetricName"] == "IteratorAge"
    assert _alarm(service, "RelaySendFailures")["Threshold"] == 2
    assert _alarm(service, "MaterializerFailures")["Threshold"] == 1
    assert _alarm(service, "ReconcileMissing")["Threshold"] == 0
    assert _alarm(service, "ReconcileMissing")["MetricName"] == "ReconcileMissing"
    # AND the reconciler's other findings alarm at their first occurrence too
    for name in ("ReconcileUnexpected", "ReconcileIncomplete"):
        assert (_alarm(service, name)["MetricName"], _alarm(service, name)["Threshold"]) == (
            name,
            0,
        )
    assert _alarm(service, "Api5xx")["Threshold"] == 7
    assert _alarm(service, "Api5xx")["MetricName"] == "5XXError"
    assert _alarm(service, "ThrottlesSchedules")["Threshold"] == 10


def test_observability_failure_alarms_cover_executions_and_invocations(service: Template):
    # THEN the materializer alarm adds failed and timed-out ticks and function errors
    # (test_alarms.py evaluates that it fires on any one of them)
    metrics = _alarm(service, "MaterializerFailures")["Metrics"]
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in metrics if "MetricStat" in m}
    assert names == {"ExecutionsFailed", "ExecutionsTimedOut", "Errors", "Throttles"}
    # AND the relay alarm fires on a batch the re-drive gave up on (its dead-letter queue:
    # test_relay.py)
    undelivered = _alarm(service, "RelayUndelivered")
    assert undelivered["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert undelivered["Threshold"] == 0
    # AND the schedules throttle alarm includes every index of the table
    throttles = _alarm(service, "ThrottlesSchedules")["Metrics"]
    indexes = {
        d["Value"]
        for m in throttles
        if "MetricStat" in m
        for d in m["MetricStat"]["Metric"]["Dimensions"]
        if d["Name"] == "GlobalSecondaryIndexName"
    }
    assert indexes == {index.name for index in ALL_TABLES[0].indexes}


def test_observability_dashboard_shows_lag_percentiles_and_the_pipeline(service: Template):
    # GIVEN the dashboard's body
    dashboards = service.find_resources("AWS::CloudWatch::Dashboard")
    assert len(dashboards) == 1
    body = render(next(iter(dashboards.values()))["Properties"]["DashboardBody"])
    widgets = json.loads(body)["widgets"]
    text = json.dumps(widgets)
    # THEN it graphs strict and flexible lag at p50/p95/p99
    for metric in ("EnqueueLagStrict", "EnqueueLagFlexible"):
        assert metric in text
    for statistic in ("p50", "p95", "p99"):
        assert f'"stat": "{statistic}"' in text
    # AND materialized / enqueued, backlog, iterator age, undelivered batches, misses,
    # throttles, API errors, and the hour's outcomes and findings as the reconciler counts
    # them (test_inventory.py checks that a function of this stack emits each one)
    for metric in (
        "Occurrences",
        "Relayed",
        "DueBacklog",
        "IteratorAge",
        "ApproximateNumberOfMessagesVisible",
        "Missed",
        "Throttles",
        "WriteThrottleEvents",
        "4XXError",
        "5XXError",
        "ReconcileSucceeded",
        "ReconcileDead",
        "ReconcileSkippedOverlap",
        "ReconcileMissing",
        "ReconcileRepaired",
    ):
        assert f'"{metric}"' in text, metric
    # AND the backlog after an outage: the planning stage's oldest unplanned bucket and
    # drain time, and the five largest tenant queues by oldest message, waiting and consumed
    for metric in ("PlanningOldestAge", "PlanningDrainSeconds"):
        assert f'"{metric}"' in text, metric
    for query in (
        'SELECT MAX(ApproximateAgeOfOldestMessage) FROM SCHEMA(\\"AWS/SQS\\", QueueName) '
        "GROUP BY QueueName ORDER BY MAX() DESC LIMIT 5",
        "SELECT MAX(ApproximateNumberOfMessagesVisible)",
        "SELECT SUM(NumberOfMessagesDeleted)",
    ):
        assert query in text, query
    # AND the tenants' drain times, which metric math cannot compute, from the drain widget
    (function_id,) = [
        logical_id
        for logical_id, function in service.find_resources("AWS::Lambda::Function").items()
        if function["Properties"]["Handler"] == "dashboard.drain.lambda_handler"
    ]
    (custom,) = [w for w in widgets if w["type"] == "custom"]
    assert custom["properties"]["endpoint"] == f"<{function_id}.Arn>"
    # AND nothing only workers emit: they run in tenants' accounts
    for metric in ("Succeeded", "Dead", "SkippedOverlap", "StaleRefused", "Retried"):
        assert f'"{metric}"' not in text, metric
    # AND the alarms' states
    assert any(w["type"] == "alarm" for w in widgets)


def test_observability_topic_is_tls_only(service: Template):
    # THEN publishing to the alarm topic without TLS is denied
    service.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            }
        },
    )


def test_observability_stack_outputs_the_api_url_and_the_alarm_topic(service: Template):
    # THEN an operator finds the API's base URL and the topic to subscribe to
    service.has_output("ApiUrl", {"Value": Match.any_value()})
    topic = next(iter(service.find_resources("AWS::SNS::Topic")))
    service.has_output("AlarmTopicArn", {"Value": {"Ref": topic}})


def test_observability_cloudwatch_may_publish_this_stacks_alarms_to_the_topic(
    service: Template,
):
    # GIVEN the topic's policy, which replaces SNS's default one
    (policy,) = service.find_resources("AWS::SNS::TopicPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (allow,) = [s for s in statements if s["Effect"] == "Allow"]
    # THEN CloudWatch may publish, on behalf of this account's alarms named after the stack
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert allow["Action"] == "sns:Publish"
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    source = render(allow["Condition"]["ArnLike"]["aws:SourceArn"])
    assert (
        source == "arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:Punctual-*"
    )
    # AND every alarm of the stack is named so (its ARN matches the condition)
    for alarm in service.find_resources("AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmName"].startswith("Punctual-")

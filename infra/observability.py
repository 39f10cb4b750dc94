"""What an operator watches: one dashboard and the alarms, which notify an SNS topic.

Punctual's own metrics are EMF metrics in namespace "Punctual" with the dimension
service=punctual (Powertools adds it to every metric), from the materializer, the relay and
the reconciler. The worker SDK's metrics are emitted where each worker runs, normally a
tenant's account: the dashboard shows what this account measures, and the reconciler's
hourly counts stand in for the workers' outcomes (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.checks import acknowledge
from infra.config import AlarmThresholds
from infra.functions import FunctionDefaults, python_function
from punctual.dal.tables import ALL_TABLES, TableSpec
from punctual.settings import Settings

NAMESPACE = "Punctual"
DIMENSIONS = {"service": "punctual"}
MINUTE = Duration.minutes(1)
FIVE_MINUTES = Duration.minutes(5)


# For alarms on filled sums: FILL gives the latest period a 0 even when a datapoint is only
# late, so a failure counts in either of the last two periods (docs: FILL in alarms).
class _Periods(TypedDict):
    evaluation_periods: int
    datapoints: int


LATE_FAILURES: _Periods = {"evaluation_periods": 2, "datapoints": 1}


def punctual_metric(
    name: str, statistic: str = "Sum", period: Duration = MINUTE, label: str | None = None
) -> cw.Metric:
    return cw.Metric(
        namespace=NAMESPACE,
        metric_name=name,
        dimensions_map=DIMENSIONS,
        statistic=statistic,
        period=period,
        # A label would make an alarm on the metric a metric-math alarm; graphs only.
        label=label,
    )


def _failed_invocations(rule: events.Rule) -> cw.Metric:
    """The rule's invocations of its target that failed (AWS/Events), per 5 minutes."""
    return cw.Metric(
        namespace="AWS/Events",
        metric_name="FailedInvocations",
        dimensions_map={"RuleName": rule.rule_name},
        statistic="Sum",
        period=FIVE_MINUTES,
    )


def filled_sum(metrics: dict[str, cw.IMetric], label: str, period: Duration) -> cw.MathExpression:
    """The sum of metrics that publish nothing while nothing happens (errors, throttles):
    each is filled with 0, since a sum with a term that has no datapoint may have none
    either and then never alarms (tests/infrastructure/cloudwatch.py evaluates it so)."""
    return cw.MathExpression(
        expression=" + ".join(f"FILL({key}, 0)" for key in metrics),
        using_metrics=metrics,
        label=label,
        period=period,
    )


def _table_throttles(spec: TableSpec, settings: Settings, period: Duration) -> cw.MathExpression:
    """Read and write throttle events of a table and of each of its indexes."""
    table = spec.name(settings)
    indexes = [index.name for index in spec.indexes]
    # Ids are unique per table: one widget graphs every table's expression.
    key = spec.setting.removesuffix("_table")
    metrics: dict[str, cw.IMetric] = {}
    for n, index in enumerate([None, *indexes]):
        dimensions = {"TableName": table}
        if index:
            dimensions["GlobalSecondaryIndexName"] = index
        for kind in ("Read", "Write"):
            metrics[f"{key}_{kind.lower()}{n}"] = cw.Metric(
                namespace="AWS/DynamoDB",
                metric_name=f"{kind}ThrottleEvents",
                dimensions_map=dimensions,
                statistic="Sum",
                period=period,
            )
    return filled_sum(metrics, f"{table} throttles", period)


@dataclass(frozen=True)
class Watched:
    """The resources whose metrics the dashboard and the alarms read."""

    api: apigw.RestApi
    api_function: lambda_.Function
    materializer: lambda_.Function
    ticker: sfn.StateMachine
    relay: lambda_.Function
    catchup_relay: lambda_.Function
    relay_failures: sqs.Queue
    relay_failures_dead: sqs.Queue  # the on-failure queue's dead-letter queue
    reconciler: lambda_.Function
    reconciler_machine: sfn.StateMachine
    ticker_rule: events.Rule  # starts the ticker every minute
    reconciler_rule: events.Rule  # starts the hourly run


class Observability(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        watched: Watched,
        settings: Settings,
        thresholds: AlarmThresholds,
        emails: Sequence[str],
        defaults: FunctionDefaults,
    ) -> None:
        super().__init__(scope, construct_id)
        self.drain_widget = self._drain_widget(defaults)
        self.topic = sns.Topic(self, "Alarms", display_name="Punctual alarms", enforce_ssl=True)
        acknowledge(
            self.topic,
            "SNS2",
            "Not encrypted at rest: CloudWatch alarms can publish to an encrypted topic only "
            "with a customer managed KMS key whose policy lets cloudwatch.amazonaws.com use it "
            "(the AWS managed SNS key does not), and the notifications carry only alarm names, "
            "states and descriptions, no tenant data: not worth a key of its own.",
        )
        # The topic's policy replaces SNS's default one, so CloudWatch needs its own grant:
        # this account's alarms of this stack only (the alarms are named after the stack).
        stack = Stack.of(self)
        self.alarm_prefix = f"{stack.stack_name}-"
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="cloudwatch",
                            resource="alarm",
                            resource_name=f"{self.alarm_prefix}*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    },
                },
            )
        )
        for email in emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.alarms: list[cw.Alarm] = []
        self._alarms(watched, settings, thresholds)
        self.dashboard = self._dashboard(watched, settings, thresholds)

    def _drain_widget(self, defaults: FunctionDefaults) -> lambda_.Function:
        """The dashboard's custom widget: the tenants' delivery backlog and drain time
        (functions/relay/drain.py). Whoever views the dashboard needs lambda:InvokeFunction
        on it (docs/operations.md, *Backlog and drain*)."""
        function = python_function(
            self,
            "DrainWidget",
            handler="relay.drain.lambda_handler",
            defaults=defaults,
            timeout=Duration.seconds(30),
            memory_mb=256,
            description="Dashboard widget: the tenants' delivery backlog and drain time",
            any_resource_reasons=("cloudwatch:GetMetricData has no resource-level permissions.",),
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["cloudwatch:GetMetricData"], resources=["*"])
        )
        return function

    # --- alarms ---------------------------------------------------------------------------

    def _alarm(
        self,
        name: str,
        metric: cw.IMetric,
        threshold: float,
        description: str,
        *,
        evaluation_periods: int = 1,
        datapoints: int = 1,
        heartbeat: bool = False,
    ) -> None:
        """An alarm when ``metric`` is above ``threshold``; a ``heartbeat`` alarm when it is
        below, or absent: what must happen every minute stopped."""
        alarm = cw.Alarm(
            self,
            name,
            alarm_name=f"{self.alarm_prefix}{name}",
            metric=metric,
            alarm_description=description,
            threshold=threshold,
            comparison_operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD
            if heartbeat
            else cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints,
            # No data means nothing happened (no strict occurrence, no request): healthy;
            # for a heartbeat, that what must happen did not.
            treat_missing_data=cw.TreatMissingData.BREACHING
            if heartbeat
            else cw.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms.append(alarm)

    def _alarms(self, w: Watched, settings: Settings, t: AlarmThresholds) -> None:
        self._alarm(
            "StrictLagP99",
            punctual_metric("EnqueueLagStrict", "p99"),
            t.strict_lag_p99_seconds,
            "Strict schedule lag p99 (receivable in the queue minus scheduled_for) is over "
            "the SLO in 2 of 3 minutes.",
            evaluation_periods=3,
            datapoints=2,
        )
        self._alarm(
            "StreamIteratorAge",
            w.relay.metric("IteratorAge", statistic="Maximum", period=MINUTE),
            t.stream_iterator_age_seconds * 1000,
            "The relay is behind the outbox stream: occurrences wait to be sent.",
            evaluation_periods=3,
            datapoints=3,
        )
        self._alarm(
            "CatchupIteratorAge",
            w.catchup_relay.metric("IteratorAge", statistic="Maximum", period=MINUTE),
            t.catchup_iterator_age_seconds * 1000,
            "The catch-up lane's relay is far behind the outbox stream: catch-up occurrences "
            "wait, and leave the stream unsent after 6 hours (the re-drive then sends them).",
            evaluation_periods=5,
            datapoints=5,
        )
        self._alarm(
            "RelayUndelivered",
            w.relay_failures_dead.metric_approximate_number_of_messages_visible(
                period=MINUTE, statistic="Maximum"
            ),
            0,
            "A stream batch the relay gave up on failed its re-drive 3 times and waits in "
            "the dead-letter queue: fix the cause (the re-drive's logs), then move it back "
            "to the on-failure queue (docs/operations.md); the stream keeps it 24 hours, "
            "then only the reconciler re-sends what no worker took.",
        )
        for name, what in (
            (
                "RedriveFailures",
                "the re-drive failed to send a stream batch the relay gave up on again; it "
                "tries again in 6 minutes (read its logs)",
            ),
            (
                "RedriveExpired",
                "a stream batch the relay gave up on expired before its re-drive: the "
                "reconciler re-sends its occurrences when it checks their hour",
            ),
            (
                "RelayRefused",
                "an occurrence whose tenant its key does not name (written by a tenant's "
                "worker, not by Punctual) was refused: read the relay's log for its id",
            ),
        ):
            self._alarm(name, punctual_metric(name, period=FIVE_MINUTES), 0, f"{what}.")
        self._alarm(
            "RelaySendFailures",
            punctual_metric("RelaySendFailures", period=FIVE_MINUTES),
            t.relay_send_failures,
            "SQS refused relay sends; the stream retries them.",
        )
        self._alarm(
            "MaterializerFailures",
            filled_sum(
                {
                    "failed": w.ticker.metric_failed(period=FIVE_MINUTES),
                    "timedOut": w.ticker.metric_timed_out(period=FIVE_MINUTES),
                    "errors": w.materializer.metric_errors(period=FIVE_MINUTES),
                    # (a throttled invocation counts as none of the others)
                    "throttles": w.materializer.metric_throttles(period=FIVE_MINUTES),
                },
                "materializer failures",
                FIVE_MINUTES,
            ),
            t.materializer_failures,
            "Materializer ticks failed or timed out, or a group's invocation failed or was "
            "throttled; its watermark holds, the next tick retries.",
            **LATE_FAILURES,
        )
        self._alarm(
            "MaterializerStopped",
            w.ticker.metric_succeeded(period=MINUTE, statistic="Sum"),
            1,
            "No materializer tick succeeded in 3 minutes (none ran: the rule is disabled or "
            "failing to start it, the state machine is throttled or gone): nothing is "
            "materialized, and the strict lag alarm has no data to fire on.",
            evaluation_periods=3,
            datapoints=3,
            heartbeat=True,
        )
        self._alarm(
            "PlanningBehind",
            punctual_metric("DueBacklog", "Maximum"),
            0,
            "The materializer left due buckets for the next tick in each of the last 5 "
            "minutes (a group out of time tick after tick, its lease held elsewhere, its "
            "shards too full): it falls behind, and fires become late once the backlog "
            "eats the lookahead. A top of the hour's minute or two of backlog is normal.",
            evaluation_periods=5,
            datapoints=5,
        )
        self._alarm(
            "ScheduleRuleFailures",
            filled_sum(
                {
                    "ticker": _failed_invocations(w.ticker_rule),
                    "hourly": _failed_invocations(w.reconciler_rule),
                },
                "rule invocations failed",
                FIVE_MINUTES,
            ),
            0,
            "EventBridge failed to start the materializer's ticker or the reconciler's "
            "hourly run (its role, a throttled or missing state machine).",
        )
        self._alarm(
            "ReconcileMissing",
            punctual_metric("ReconcileMissing", period=Duration.hours(1)),
            t.reconcile_missing,
            "The reconciler found expected occurrences that were never materialized.",
        )
        for name, what in (
            (
                "ReconcileUnexpected",
                "a stored occurrence no schedule version owns (a planning "
                "or versioning bug; its id is in the run's report)",
            ),
            (
                "ReconcileIncomplete",
                "a shard was not fully checked within the run (use smaller "
                "reconciler shard groups); the next run checks that hour again",
            ),
            (
                "ReconcileRedriven",
                "occurrences no worker took long after they were due, and re-sent them "
                "(messages lost after the send, or a tenant's workers down)",
            ),
            (
                "ReconcileGaveUp",
                "an hour that still had something open (in flight, deferred, a repair that "
                "lost its race) when it left the two-day catch-up horizon: no run checks it "
                "again; its report names it, re-run the window by hand",
            ),
            (
                "ReconcileCursorsMoved",
                "schedules left in a due bucket the walk had passed (the due index lagged "
                "past the API's margin) and moved them ahead of the walk",
            ),
        ):
            self._alarm(
                name,
                punctual_metric(name, period=Duration.hours(1)),
                0,
                f"The reconciler found {what}.",
            )
        self._alarm(
            "ReconcilerFailures",
            filled_sum(
                {
                    "failed": w.reconciler_machine.metric_failed(period=Duration.hours(1)),
                    "timedOut": w.reconciler_machine.metric_timed_out(period=Duration.hours(1)),
                },
                "reconciler failures",
                Duration.hours(1),
            ),
            0,
            "An hourly reconciliation run failed or timed out (some shard groups unchecked).",
            **LATE_FAILURES,
        )
        for spec in ALL_TABLES:
            name = spec.name(settings)
            self._alarm(
                f"Throttles{spec.setting.removesuffix('_table').title()}",
                _table_throttles(spec, settings, FIVE_MINUTES),
                t.dynamodb_throttles,
                f"DynamoDB throttled requests to {name} or its indexes (hot partition).",
                **LATE_FAILURES,
            )
        self._alarm(
            "Api5xx",
            w.api.metric_server_error(period=FIVE_MINUTES, statistic="Sum"),
            t.api_5xx,
            "The API answered 5xx.",
        )

    # --- dashboard ------------------------------------------------------------------------

    @staticmethod
    def _backlog_widgets(graph: Callable[..., cw.GraphWidget]) -> list[cw.IWidget]:
        """After an outage (docs/operations.md, *Backlog and drain*): the planning backlog
        (the materializer's walks) and the delivery backlog (the tenants' queues), each by
        the age of its oldest due work and how fast it drains; the largest tenants by
        their queues (Metrics Insights, top 5)."""

        def top(function: str, metric: str, label: str) -> cw.MathExpression:
            return cw.MathExpression(
                expression=(
                    f'SELECT {function}({metric}) FROM SCHEMA("AWS/SQS", QueueName) '
                    f"GROUP BY QueueName ORDER BY {function}() DESC LIMIT 5"
                ),
                label=label,
                period=MINUTE,
            )

        return [
            graph(
                "Planning backlog: oldest unplanned (s), drain time (s)",
                [
                    punctual_metric("PlanningOldestAge", "Maximum", label="oldest unplanned"),
                    punctual_metric("PlanningDrainSeconds", "Maximum", label="drain time"),
                ],
            ),
            graph(
                "Largest tenant queues: oldest message (s)",
                [top("MAX", "ApproximateAgeOfOldestMessage", "")],
            ),
            graph(
                "Largest tenant queues: waiting, consumed per minute",
                [top("MAX", "ApproximateNumberOfMessagesVisible", "")],
                right=[top("SUM", "NumberOfMessagesDeleted", "")],
            ),
        ]

    def _dashboard(self, w: Watched, settings: Settings, t: AlarmThresholds) -> cw.Dashboard:
        functions = {
            "api": w.api_function,
            "materializer": w.materializer,
            "relay": w.relay,
            "catch-up relay": w.catchup_relay,
            "reconciler": w.reconciler,
        }

        def graph(
            title: str,
            metrics: Sequence[cw.IMetric],
            right: Sequence[cw.IMetric] = (),
            annotations: Sequence[cw.HorizontalAnnotation] = (),
        ) -> cw.GraphWidget:
            return cw.GraphWidget(
                title=title,
                left=list(metrics),
                right=list(right),
                left_annotations=list(annotations),
                width=8,
                height=6,
            )

        lag = [
            punctual_metric(f"EnqueueLag{kind}", stat, label=f"{kind.lower()} {stat}")
            for kind in ("Strict", "Flexible")
            for stat in ("p50", "p95", "p99")
        ]
        dashboard = cw.Dashboard(
            self,
            "Dashboard",
            dashboard_name=Stack.of(self).stack_name,
            default_interval=Duration.hours(3),
        )
        dashboard.add_widgets(
            graph(
                "Schedule lag (s): receivable minus scheduled_for",
                lag,
                right=[
                    punctual_metric(
                        "EnqueueLagCatchup", "p99", label="catch-up p99 (behind its pace)"
                    )
                ],
                annotations=[
                    cw.HorizontalAnnotation(
                        value=t.strict_lag_p99_seconds, label="strict p99 alarm"
                    )
                ],
            ),
            graph(
                "Per minute: materialized, enqueued",
                [
                    punctual_metric("Occurrences", label="materialized"),
                    punctual_metric("Relayed", label="enqueued"),
                ],
            ),
            graph(
                "Due backlog (materializer, max per minute)",
                [punctual_metric("DueBacklog", "Maximum")],
            ),
        )
        dashboard.add_widgets(
            graph(
                "Outbox stream iterator age (ms)",
                [
                    w.relay.metric(
                        "IteratorAge", statistic="Maximum", period=MINUTE, label="on time"
                    ),
                    w.catchup_relay.metric(
                        "IteratorAge", statistic="Maximum", period=MINUTE, label="catch-up"
                    ),
                ],
            ),
            graph(
                "Errors",
                [
                    *(
                        fn.metric_errors(period=MINUTE, label=f"{name} errors")
                        for name, fn in functions.items()
                    ),
                    punctual_metric("RelaySendFailures"),
                    w.ticker.metric_failed(period=MINUTE, label="ticks failed"),
                    w.ticker.metric_timed_out(period=MINUTE, label="ticks timed out"),
                ],
            ),
            graph(
                "Undelivered and misfired",
                [
                    w.relay_failures.metric_approximate_number_of_messages_visible(
                        period=MINUTE, statistic="Maximum", label="relay on-failure queue"
                    ),
                    w.relay_failures_dead.metric_approximate_number_of_messages_visible(
                        period=MINUTE, statistic="Maximum", label="re-drive gave up (dead)"
                    ),
                    punctual_metric("RedriveFailures", label="re-drive failures"),
                    punctual_metric("DeadUnknownTarget", label="dead (unknown target)"),
                    punctual_metric("Missed", label="missed (misfire policy)"),
                ],
            ),
        )
        dashboard.add_widgets(
            graph(
                "Throttles",
                [
                    *(
                        fn.metric_throttles(period=MINUTE, label=f"{name} Lambda throttles")
                        for name, fn in functions.items()
                    ),
                    *(_table_throttles(spec, settings, MINUTE) for spec in ALL_TABLES),
                ],
            ),
            graph(
                "API: requests, 4xx, 5xx",
                [
                    w.api.metric_count(period=MINUTE, label="requests"),
                    w.api.metric_client_error(period=MINUTE, label="4xx"),
                    w.api.metric_server_error(period=MINUTE, label="5xx"),
                ],
                right=[w.api.metric_latency(period=MINUTE, statistic="p99", label="p99 ms")],
            ),
            graph(
                "Materializer internals",
                [
                    punctual_metric(name)
                    for name in ("CursorConflicts", "ShardsBusy", "LeasesLost", "ShardsOutOfTime")
                ],
            ),
        )
        dashboard.add_widgets(
            # What became of the last hour's occurrences, as the reconciler counts them in
            # the tables: the workers' own metrics are in the accounts where workers run.
            graph(
                "Outcomes per hour (reconciler)",
                [
                    punctual_metric(f"Reconcile{name}", period=Duration.hours(1), label=label)
                    for name, label in (
                        ("Succeeded", "succeeded"),
                        ("Dead", "dead"),
                        ("Missed", "missed"),
                        ("SkippedOverlap", "skipped (overlap)"),
                        ("Canceled", "canceled"),
                        ("InFlight", "in flight"),
                    )
                ],
            ),
            graph(
                "Reconciler findings (per hour)",
                [
                    punctual_metric(name, period=Duration.hours(1))
                    for name in (
                        "ReconcileMissing",
                        "ReconcileUnexpected",
                        "ReconcileRepaired",
                        "ReconcileIncomplete",
                        "ReconcileGaveUp",
                    )
                ],
            ),
            cw.TextWidget(
                markdown=(
                    "**Workers** emit their own metrics (namespace `Punctual`: Succeeded, "
                    "Retried, Dead, StaleRefused, SkippedOverlap, OverlapWaiting, "
                    "ConcurrencyThrottled, "
                    "DuplicateClaims, Rejected) in the account where each worker runs. "
                    "This account sees their outcomes in the reconciler's hourly counts. "
                    "See docs/deploy.md, *Watching workers*."
                ),
                width=8,
                height=6,
            ),
        )
        dashboard.add_widgets(*self._backlog_widgets(graph))
        dashboard.add_widgets(
            cw.CustomWidget(
                function_arn=self.drain_widget.function_arn,
                title="Delivery backlog and drain time: all tenants, the 5 largest",
                width=24,
                height=5,
            )
        )
        dashboard.add_widgets(
            cw.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms), width=24, height=4)
        )
        return dashboard

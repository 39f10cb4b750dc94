"""What an operator watches: one dashboard and the alarms, which notify an SNS topic.

Punctual's own metrics are EMF metrics in namespace "Punctual" with the dimension
service=punctual (Powertools adds it to every metric), from the materializer, the relay and
the reconciler. The worker SDK's metrics are emitted where each worker runs, normally a
tenant's account: the dashboard shows what this account measures, and the reconciler's
hourly counts stand in for the workers' outcomes (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
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

    def functions(self) -> dict[str, lambda_.Function]:
        """The functions the dashboard graphs side by side, by the label it gives them."""
        return {
            "api": self.api_function,
            "materializer": self.materializer,
            "relay": self.relay,
            "catch-up relay": self.catchup_relay,
            "reconciler": self.reconciler,
        }


# The alarms on incidents of the relay and its re-drive, each on a count that is 0 while all
# is well: (metric and alarm name, what happened).
_RELAY_INCIDENTS = (
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
)

# The alarms on the reconciler's hourly findings that are 0 while all is well: (metric and
# alarm name, what the reconciler found).
_RECONCILER_FINDINGS = (
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
)


def _graph(
    title: str,
    metrics: Sequence[cw.IMetric],
    right: Sequence[cw.IMetric] = (),
    annotations: Sequence[cw.HorizontalAnnotation] = (),
) -> cw.GraphWidget:
    """A third of the dashboard's width."""
    return cw.GraphWidget(
        title=title,
        left=list(metrics),
        right=list(right),
        left_annotations=list(annotations),
        width=8,
        height=6,
    )


def _largest_queues(function: str, metric: str, label: str) -> cw.MathExpression:
    """``metric`` of the 5 tenant queues where ``function`` of it is largest (Metrics
    Insights)."""
    return cw.MathExpression(
        expression=(
            f'SELECT {function}({metric}) FROM SCHEMA("AWS/SQS", QueueName) '
            f"GROUP BY QueueName ORDER BY {function}() DESC LIMIT 5"
        ),
        label=label,
        period=MINUTE,
    )


class Observability(Construct):
    """The alarm topic, the alarms, and the dashboard with its custom widget."""

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
        # The alarms are named after the stack: the topic's policy admits them by name.
        self.alarm_prefix = f"{Stack.of(self).stack_name}-"
        self.topic = self._alarm_topic(emails)
        self.alarms: list[cw.Alarm] = []
        self._alarms(watched, settings, thresholds)
        self.dashboard = self._dashboard(watched, settings, thresholds)

    def _drain_widget(self, defaults: FunctionDefaults) -> lambda_.Function:
        """The dashboard's custom widget: the tenants' delivery backlog and drain time
        (functions/dashboard/drain.py). Whoever views the dashboard needs lambda:InvokeFunction
        on it (docs/operations.md, *Backlog and drain*)."""
        function = python_function(
            self,
            "DrainWidget",
            handler="dashboard.drain.lambda_handler",
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

    # --- alarm topic ----------------------------------------------------------------------

    def _alarm_topic(self, emails: Sequence[str]) -> sns.Topic:
        """The topic every alarm notifies, with its email subscriptions."""
        topic = sns.Topic(self, "Alarms", display_name="Punctual alarms", enforce_ssl=True)
        acknowledge(
            topic,
            "SNS2",
            "Not encrypted at rest: CloudWatch alarms can publish to an encrypted topic only "
            "with a customer managed KMS key whose policy lets cloudwatch.amazonaws.com use it "
            "(the AWS managed SNS key does not), and the notifications carry only alarm names, "
            "states and descriptions, no tenant data: not worth a key of its own.",
        )
        self._allow_alarms_to_publish(topic)
        for email in emails:
            topic.add_subscription(subscriptions.EmailSubscription(email))
        return topic

    def _allow_alarms_to_publish(self, topic: sns.Topic) -> None:
        """The topic's policy replaces SNS's default one, so CloudWatch needs its own grant:
        this account's alarms of this stack only."""
        stack = Stack.of(self)
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
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
        """Every alarm, in the order the dashboard's alarm status widget lists them."""
        self._lag_alarms(w, t)
        self._relay_failure_alarms(w, t)
        self._materializer_alarms(w, t)
        self._schedule_rule_alarm(w)
        self._reconciler_alarms(w, t)
        self._throttle_alarms(settings, t)
        self._api_alarm(w, t)
        self._clock_alarm(t)

    def _lag_alarms(self, w: Watched, t: AlarmThresholds) -> None:
        """Occurrences late into their queues: the strict SLO, and each lane's relay behind
        the outbox stream."""
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

    def _relay_failure_alarms(self, w: Watched, t: AlarmThresholds) -> None:
        """Occurrences the relay did not send: batches past their re-drive, the re-drive's
        incidents, sends SQS refused."""
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
        for name, what in _RELAY_INCIDENTS:
            self._alarm(name, punctual_metric(name, period=FIVE_MINUTES), 0, f"{what}.")
        self._alarm(
            "RelaySendFailures",
            punctual_metric("RelaySendFailures", period=FIVE_MINUTES),
            t.relay_send_failures,
            "SQS refused relay sends; the stream retries them.",
        )

    def _materializer_alarms(self, w: Watched, t: AlarmThresholds) -> None:
        """Ticks that failed, ticks that stopped, and planning falling behind."""
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

    def _schedule_rule_alarm(self, w: Watched) -> None:
        """EventBridge failing to start either scheduled workflow."""
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

    def _reconciler_alarms(self, w: Watched, t: AlarmThresholds) -> None:
        """What the hourly reconciliation found, and runs that failed."""
        self._alarm(
            "ReconcileMissing",
            punctual_metric("ReconcileMissing", period=Duration.hours(1)),
            t.reconcile_missing,
            "The reconciler found expected occurrences that were never materialized.",
        )
        for name, what in _RECONCILER_FINDINGS:
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
        self._alarm(
            "ReconcilerStopped",
            # (Filled with 0: an hour without a run is a breach at once, not only once the
            # readback of CloudWatch's evaluation range, two more hours, has no datapoint.)
            filled_sum(
                {"succeeded": w.reconciler_machine.metric_succeeded(period=Duration.hours(1))},
                "reconciliation runs succeeded",
                Duration.hours(1),
            ),
            1,
            "No hourly reconciliation run succeeded in 2 hours: runs failing "
            "(ReconcilerFailures says so too), or none running (the rule disabled or failing "
            "to start it, the state machine throttled or gone, which nothing else says): no "
            "lost fire is found or repaired. In ALARM after a first deploy until the first "
            "run succeeds, and in a passive region whose rules are disabled.",
            evaluation_periods=2,
            datapoints=2,
            heartbeat=True,
        )

    def _throttle_alarms(self, settings: Settings, t: AlarmThresholds) -> None:
        """One per table, its indexes included."""
        for spec in ALL_TABLES:
            name = spec.name(settings)
            self._alarm(
                f"Throttles{spec.setting.removesuffix('_table').title()}",
                _table_throttles(spec, settings, FIVE_MINUTES),
                t.dynamodb_throttles,
                f"DynamoDB throttled requests to {name} or its indexes (hot partition).",
                **LATE_FAILURES,
            )

    def _api_alarm(self, w: Watched, t: AlarmThresholds) -> None:
        self._alarm(
            "Api5xx",
            w.api.metric_server_error(period=FIVE_MINUTES, statistic="Sum"),
            t.api_5xx,
            "The API answered 5xx.",
        )

    def _clock_alarm(self, t: AlarmThresholds) -> None:
        self._alarm(
            "ClockSkew",
            punctual_metric("ClockSkew", "Maximum"),
            t.clock_skew_seconds,
            "A component's clock is off DynamoDB's (each answer's Date bounds it): the "
            "relay's makes messages receivable early or late by as much. The warning 'clock "
            "off DynamoDB's' names the component (docs/operations.md, Clock skew).",
            evaluation_periods=3,
            datapoints=3,
        )

    # --- dashboard ------------------------------------------------------------------------

    def _dashboard(self, w: Watched, settings: Settings, t: AlarmThresholds) -> cw.Dashboard:
        """One method per row, top to bottom."""
        dashboard = cw.Dashboard(
            self,
            "Dashboard",
            dashboard_name=Stack.of(self).stack_name,
            default_interval=Duration.hours(3),
        )
        dashboard.add_widgets(*self._flow_row(t))
        dashboard.add_widgets(*self._relay_row(w))
        dashboard.add_widgets(*self._load_row(w, settings))
        dashboard.add_widgets(*self._reconciler_row())
        dashboard.add_widgets(*self._backlog_row())
        dashboard.add_widgets(self._drain_row())
        dashboard.add_widgets(self._alarm_row())
        return dashboard

    @staticmethod
    def _flow_row(t: AlarmThresholds) -> list[cw.IWidget]:
        """How late occurrences reach their queues, how many are planned and sent, and
        what planning left for the next tick."""
        lag = [
            punctual_metric(f"EnqueueLag{kind}", stat, label=f"{kind.lower()} {stat}")
            for kind in ("Strict", "Flexible")
            for stat in ("p50", "p95", "p99")
        ]
        return [
            _graph(
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
            _graph(
                "Per minute: materialized, enqueued",
                [
                    punctual_metric("Occurrences", label="materialized"),
                    punctual_metric("Relayed", label="enqueued"),
                ],
            ),
            _graph(
                "Due backlog (max per minute); clock skew (s, right)",
                [punctual_metric("DueBacklog", "Maximum")],
                right=[
                    punctual_metric(
                        "ClockSkew", "Maximum", label="clock skew off DynamoDB's (at least)"
                    )
                ],
            ),
        ]

    @staticmethod
    def _relay_row(w: Watched) -> list[cw.IWidget]:
        """The relay behind the stream, every function's errors, what was not delivered."""
        return [
            _graph(
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
            _graph(
                "Errors",
                [
                    *(
                        fn.metric_errors(period=MINUTE, label=f"{name} errors")
                        for name, fn in w.functions().items()
                    ),
                    punctual_metric("RelaySendFailures"),
                    w.ticker.metric_failed(period=MINUTE, label="ticks failed"),
                    w.ticker.metric_timed_out(period=MINUTE, label="ticks timed out"),
                ],
            ),
            _graph(
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
        ]

    @staticmethod
    def _load_row(w: Watched, settings: Settings) -> list[cw.IWidget]:
        """Throttles of every function and table, the API's traffic, the materializer's
        contention."""
        return [
            _graph(
                "Throttles",
                [
                    *(
                        fn.metric_throttles(period=MINUTE, label=f"{name} Lambda throttles")
                        for name, fn in w.functions().items()
                    ),
                    *(_table_throttles(spec, settings, MINUTE) for spec in ALL_TABLES),
                ],
            ),
            _graph(
                "API: requests, 4xx, 5xx",
                [
                    w.api.metric_count(period=MINUTE, label="requests"),
                    w.api.metric_client_error(period=MINUTE, label="4xx"),
                    w.api.metric_server_error(period=MINUTE, label="5xx"),
                ],
                right=[w.api.metric_latency(period=MINUTE, statistic="p99", label="p99 ms")],
            ),
            _graph(
                "Materializer internals",
                [
                    punctual_metric(name)
                    for name in ("CursorConflicts", "ShardsBusy", "LeasesLost", "ShardsOutOfTime")
                ],
            ),
        ]

    @staticmethod
    def _reconciler_row() -> list[cw.IWidget]:
        """What became of the last hour's occurrences, as the reconciler counts them in the
        tables: the workers' own metrics are in the accounts where workers run."""
        return [
            _graph(
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
            _graph(
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
        ]

    @staticmethod
    def _backlog_row() -> list[cw.IWidget]:
        """After an outage (docs/operations.md, *Backlog and drain*): the planning backlog
        (the materializer's walks) and the delivery backlog (the tenants' queues), each by
        the age of its oldest due work and how fast it drains; the largest tenants by
        their queues (Metrics Insights, top 5)."""
        return [
            _graph(
                "Planning backlog: oldest unplanned (s), drain time (s)",
                [
                    punctual_metric("PlanningOldestAge", "Maximum", label="oldest unplanned"),
                    punctual_metric("PlanningDrainSeconds", "Maximum", label="drain time"),
                ],
            ),
            _graph(
                "Largest tenant queues: oldest message (s)",
                [_largest_queues("MAX", "ApproximateAgeOfOldestMessage", "")],
            ),
            _graph(
                "Largest tenant queues: waiting, consumed per minute",
                [_largest_queues("MAX", "ApproximateNumberOfMessagesVisible", "")],
                right=[_largest_queues("SUM", "NumberOfMessagesDeleted", "")],
            ),
        ]

    def _drain_row(self) -> cw.IWidget:
        return cw.CustomWidget(
            function_arn=self.drain_widget.function_arn,
            title="Delivery backlog and drain time: all tenants, the 5 largest",
            width=24,
            height=5,
        )

    def _alarm_row(self) -> cw.IWidget:
        return cw.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms), width=24, height=4)

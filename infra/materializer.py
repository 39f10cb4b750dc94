"""Materialization: EventBridge every minute -> an Express state machine -> a Map over
shard groups -> the materializer Lambda, one invocation per group."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.checks import acknowledge
from infra.data import Access, DataReferences
from infra.functions import FunctionDefaults, log_group, python_function


def map_over_groups(scope: Construct, time_key: str, max_concurrency: int) -> sfn.Map:
    """The Map over ``$.groups``: each iteration gets the run's time and one shard group."""
    return sfn.Map(
        scope,
        "EachShardGroup",
        items_path="$.groups",
        max_concurrency=max_concurrency,
        item_selector={
            time_key: sfn.JsonPath.string_at(f"$.{time_key}"),
            "shards": sfn.JsonPath.string_at("$$.Map.Item.Value"),
        },
    )


def shard_groups(shard_count: int, group_size: int) -> list[list[int]]:
    return [
        list(range(start, min(start + group_size, shard_count)))
        for start in range(0, shard_count, group_size)
    ]


def acknowledge_state_machine(machine: sfn.StateMachine, function: lambda_.IFunction) -> None:
    """The findings every Punctual state machine shares (it invokes one function)."""
    acknowledge(
        machine,
        "IAM5[Resource::<"
        + machine.stack.get_logical_id(function.node.default_child)  # type: ignore[arg-type]
        + ".Arn>:*]",
        "LambdaInvoke may call any version or alias of its one function ('<arn>:*'); "
        "no other function.",
    )
    acknowledge(
        machine,
        "IAM5[Resource::*]",
        "X-Ray tracing (xray:PutTraceSegments, PutTelemetryRecords, GetSampling*) and "
        "CloudWatch Logs delivery (logs:CreateLogDelivery and the other *LogDelivery, "
        "PutResourcePolicy, DescribeResourcePolicies, DescribeLogGroups) have no "
        "resource-level permissions.",
    )
    acknowledge(
        machine,
        "SF1",
        "Only ERROR events are logged: ALL would log every state of every group on every "
        "run; the function logs, X-Ray and the execution metrics cover the rest.",
    )


class Materialization(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        defaults: FunctionDefaults,
        group_size: int,
        max_concurrency: int,
    ) -> None:
        super().__init__(scope, construct_id)
        settings = data.settings
        self.function = python_function(
            self,
            "Function",
            handler="materializer.handler.lambda_handler",
            defaults=defaults,
            # A tick is one minute; a group that runs out of time leaves its watermark
            # where it stopped and the next tick continues from there.
            timeout=Duration.seconds(55),
            # CPU scales with memory: planning fires and building transactions is Python
            # work, and one group must plan its shards' whole minute inside the tick.
            memory_mb=1024,
            description="Turns due schedules of a shard group into occurrences",
        )
        data.grant(self.function, Access.READ_WRITE, "schedules_table", "leases_table")
        data.grant(self.function, Access.READ_WRITE, "tenants_table")
        data.grant(self.function, Access.WRITE, "occurrences_table")

        invoke = tasks.LambdaInvoke(
            self,
            "MaterializeGroup",
            lambda_function=self.function,
            payload=sfn.TaskInput.from_object(
                {
                    "tick": sfn.JsonPath.string_at("$.tick"),
                    "shards": sfn.JsonPath.list_at("$.shards"),
                }
            ),
            payload_response_only=True,
            retry_on_service_exceptions=True,
        )
        invoke.add_retry(
            errors=["States.ALL"],
            interval=Duration.seconds(2),
            backoff_rate=2,
            max_attempts=2,
        )
        # A group that still fails is given up for this tick only: its watermark did not
        # move, so the next tick starts where it stopped. Nothing is lost.
        invoke.add_catch(sfn.Pass(self, "GroupLeftForNextTick"), errors=["States.ALL"])
        each_group = map_over_groups(self, "tick", max_concurrency)
        each_group.item_processor(invoke)
        # Express: about 43,200 runs a month of a few seconds each cost about $1.35, where
        # Standard would bill about 20 transitions a run, $21.60 (docs/materializer.md);
        # a run fits Express's 5-minute cap, and its at-least-once start is harmless
        # because leases and conditional writes make a duplicate run a no-op.
        self.state_machine = sfn.StateMachine(
            self,
            "Ticker",
            state_machine_type=sfn.StateMachineType.EXPRESS,
            definition_body=sfn.DefinitionBody.from_chainable(each_group),
            timeout=Duration.seconds(90),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=log_group(self, "TickerLogs", defaults.log_retention),
                level=sfn.LogLevel.ERROR,
            ),
        )
        acknowledge_state_machine(self.state_machine, self.function)
        self.rule = events.Rule(
            self,
            "EveryMinute",
            schedule=events.Schedule.rate(Duration.minutes(1)),
            targets=[
                targets.SfnStateMachine(
                    self.state_machine,
                    input=events.RuleTargetInput.from_object(
                        {
                            "tick": events.EventField.time,
                            "groups": shard_groups(settings.shard_count, group_size),
                        }
                    ),
                )
            ],
        )

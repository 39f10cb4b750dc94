"""Materialization: EventBridge every minute -> an Express state machine -> a Map over
shard groups -> the materializer Lambda, one invocation per group."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.data import Data
from infra.functions import python_function


def shard_groups(shard_count: int, group_size: int) -> list[list[int]]:
    return [
        list(range(start, min(start + group_size, shard_count)))
        for start in range(0, shard_count, group_size)
    ]


class Materialization(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: Data,
        layer: lambda_.ILayerVersion,
        environment: dict[str, str],
        group_size: int,
        max_concurrency: int,
    ) -> None:
        super().__init__(scope, construct_id)
        settings = data.settings
        self.function = python_function(
            self,
            "Function",
            handler="materializer.handler.lambda_handler",
            layer=layer,
            environment=environment,
            timeout=Duration.seconds(55),  # a tick is one minute; the watermark carries the rest
            memory_mb=1024,
        )
        tables = data.tables
        tables["schedules_table"].grant_read_write_data(self.function)
        tables["occurrences_table"].grant_write_data(self.function)
        tables["leases_table"].grant_read_write_data(self.function)
        tables["tenants_table"].grant_read_write_data(self.function)

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
        each_group = sfn.Map(
            self,
            "EachShardGroup",
            items_path="$.groups",
            max_concurrency=max_concurrency,
            item_selector={
                "tick": sfn.JsonPath.string_at("$.tick"),
                "shards": sfn.JsonPath.string_at("$$.Map.Item.Value"),
            },
        )
        each_group.item_processor(invoke)
        self.state_machine = sfn.StateMachine(
            self,
            "Ticker",
            state_machine_type=sfn.StateMachineType.EXPRESS,
            definition_body=sfn.DefinitionBody.from_chainable(each_group),
            timeout=Duration.seconds(90),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=logs.LogGroup(
                    self, "TickerLogs", retention=logs.RetentionDays.ONE_MONTH
                ),
                level=sfn.LogLevel.ERROR,
            ),
        )
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

"""Materialization: EventBridge every minute -> an Express state machine -> a Map over
shard groups -> the materializer Lambda, one invocation per group."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import (
    MATERIALIZER_RETRY,
    MATERIALIZER_TIMEOUT_SECONDS,
    TICKER_TIMEOUT_SECONDS,
)
from infra.data import DataReferences
from infra.functions import FunctionDefaults, python_function
from infra.groups import group_invoke, map_over_groups, scheduled_over_groups
from punctual.dal.tables import DUE_INDEX
from punctual.domain.ids import shard_groups


class Materialization(Construct):
    """The materializer function and the ticker that invokes it once per shard group every
    minute."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        defaults: FunctionDefaults,
        group_size: int,
        max_concurrency: int,
        reserved_concurrency: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = self._materializer_function(defaults, reserved_concurrency)
        self._grant_tables(data)
        self.state_machine, self.rule = self._ticker(
            self._each_group(max_concurrency),
            defaults,
            shard_groups(data.settings.shard_count, group_size),
        )

    def _materializer_function(
        self, defaults: FunctionDefaults, reserved_concurrency: int
    ) -> lambda_.Function:
        return python_function(
            self,
            "Function",
            handler="materializer.handler.lambda_handler",
            defaults=defaults,
            # A tick is one minute; a group that runs out of time leaves its watermark
            # where it stopped and the next tick continues from there.
            timeout=Duration.seconds(MATERIALIZER_TIMEOUT_SECONDS),
            # CPU scales with memory: planning fires and building transactions is Python
            # work, and one group must plan its shards' whole minute inside the tick.
            memory_mb=1024,
            description="Turns due schedules of a shard group into occurrences",
            # Every group of every tick that may run at once: a relay draining a backlog
            # never throttles planning (DeployConfig.materializer_concurrency).
            reserved_concurrency=reserved_concurrency,
        )

    def _grant_tables(self, data: DataReferences) -> None:
        """Exactly what the materializer's code calls (tests/infrastructure/inventory.txt)."""
        data.grant(
            self.function,
            {
                # Shard leases and watermarks; the fence check in every transaction; the
                # shard's tallies of released quota (read whole before they are handed over).
                ("leases_table", None): ("GetItem", "UpdateItem", "ConditionCheckItem"),
                ("schedules_table", DUE_INDEX): ("Query",),
                # BatchGetItem: the payloads of a bucket's schedules, from their version items.
                ("schedules_table", None): ("GetItem", "BatchGetItem", "UpdateItem"),
                ("tenants_table", None): ("GetItem", "UpdateItem"),
                # Occurrences are put in the step's transaction; a schedule planned under
                # older zone rules is re-planned first (punctual.pipeline.rezone): its occurrences
                # read, those at instants no longer fired canceled.
                ("occurrences_table", None): ("PutItem", "Query", "UpdateItem"),
            },
        )

    def _each_group(self, max_concurrency: int) -> sfn.Map:
        """The Map over the shard groups, one invocation of the function per group."""
        # A group that fails fast (throttling, an error) is retried within the tick.
        invoke = group_invoke(
            self,
            "MaterializeGroup",
            self.function,
            "tick",
            MATERIALIZER_RETRY,
            payload_response_only=True,
        )
        # A group that still fails is given up for this tick only: its watermark did not
        # move, so the next tick starts where it stopped. Nothing is lost.
        invoke.add_catch(sfn.Pass(self, "GroupLeftForNextTick"), errors=["States.ALL"])
        each_group = map_over_groups(self, "tick", max_concurrency)
        each_group.item_processor(invoke)
        return each_group

    def _ticker(
        self, each_group: sfn.Map, defaults: FunctionDefaults, groups: list[list[int]]
    ) -> tuple[sfn.StateMachine, events.Rule]:
        """The state machine running ``each_group`` and the rule starting it every minute.

        Express: about 43,200 runs a month of a few seconds each cost about $1.35, where
        Standard would bill about 20 transitions a run, $21.60 (docs/materializer.md); a
        run fits Express's 5-minute cap, and its at-least-once start is harmless because
        leases and conditional writes make a duplicate run a no-op."""
        return scheduled_over_groups(
            self,
            name="Ticker",
            machine_type=sfn.StateMachineType.EXPRESS,
            definition=each_group,
            timeout=Duration.seconds(TICKER_TIMEOUT_SECONDS),
            function=self.function,
            log_retention=defaults.log_retention,
            rule_id="EveryMinute",
            schedule=events.Schedule.rate(Duration.minutes(1)),
            time_key="tick",
            groups=groups,
        )

"""Reconciliation: EventBridge hourly -> a Standard state machine -> a Map over the same
shard groups as the materializer -> the reconciler Lambda, one invocation per group."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import (
    RECONCILE_RUN_TIMEOUT_SECONDS,
    RECONCILER_RETRY,
    RECONCILER_TIMEOUT_SECONDS,
)
from infra.data import DataReferences
from infra.functions import FunctionDefaults, python_function
from infra.groups import group_invoke, map_over_groups, scheduled_over_groups
from infra.queues import TargetQueueAccess
from punctual.dal.tables import DUE_INDEX, SHARD_INDEX
from punctual.domain.ids import shard_groups


class Reconciliation(Construct):
    """The reconciler function and the hourly run that invokes it once per shard group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        queues: TargetQueueAccess,
        defaults: FunctionDefaults,
        group_size: int,
        max_concurrency: int,
        minute: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = self._reconciler_function(defaults)
        self._grant_calls(data, queues)
        each_group = self._each_group(max_concurrency)
        outcome = self._any_group_failed()
        verdict = self._verdict()
        self.state_machine, self.rule = self._hourly_run(
            each_group.next(outcome).next(verdict),
            defaults,
            minute,
            shard_groups(data.settings.shard_count, group_size),
        )

    def _reconciler_function(self, defaults: FunctionDefaults) -> lambda_.Function:
        return python_function(
            self,
            "Function",
            handler="reconciler.handler.lambda_handler",
            defaults=defaults,
            # Recomputing an hour of expected fires for every schedule of a shard group is
            # the longest job in the system: Lambda's whole 15 minutes.
            timeout=Duration.seconds(RECONCILER_TIMEOUT_SECONDS),
            # The recomputation is single-threaded Python: 1,769 MB is one full vCPU, the
            # most that code can use.
            memory_mb=1769,
            description="Recomputes expected occurrences of a shard group and repairs gaps",
        )

    def _grant_calls(self, data: DataReferences, queues: TargetQueueAccess) -> None:
        """Exactly what the reconciler's code calls (tests/infrastructure/inventory.txt): it
        reads schedule versions and stored occurrences, repairs a gap in one transaction
        (the occurrence put, a check on the schedule), moves a schedule left behind the
        walk (due buckets, the shard's watermark), re-sends what no worker took (the
        occurrences read again, their queues) and reads and saves its reports."""
        data.grant(
            self.function,
            {
                ("schedules_table", SHARD_INDEX): ("Query",),
                ("schedules_table", DUE_INDEX): ("Query",),
                # BatchGetItem: a repaired schedule's payload, from its version item.
                ("schedules_table", None): (
                    "GetItem",
                    "BatchGetItem",
                    "Query",
                    "UpdateItem",
                    "ConditionCheckItem",
                ),
                ("occurrences_table", None): ("Query", "BatchGetItem", "PutItem", "UpdateItem"),
                ("tenants_table", None): ("GetItem",),
                ("leases_table", None): (
                    "GetItem",
                    "BatchGetItem",
                    "PutItem",
                    "ConditionCheckItem",
                ),
                # Each tenant's ledger page of an hour checked (those that changed: the
                # stored pages' digests are read first), and the hour's mark.
                ("ledger_table", None): ("BatchGetItem", "PutItem"),
            },
        )
        queues.grant(self.function, "SendMessage")

    def _each_group(self, max_concurrency: int) -> sfn.Map:
        """The Map over the shard groups; each iteration records whether its group was
        reconciled ("ok") or failed ("failed")."""
        invoke = group_invoke(
            self,
            "ReconcileGroup",
            self.function,
            "time",
            RECONCILER_RETRY,
            result_path=sfn.JsonPath.DISCARD,
        )
        # A group that fails is recorded and the others go on; the run then fails as a
        # whole, so that its failure is an execution metric the alarms see.
        group = invoke.next(sfn.Pass(self, "GroupReconciled", result=sfn.Result.from_string("ok")))
        invoke.add_catch(
            sfn.Pass(self, "GroupFailed", result=sfn.Result.from_string("failed")),
            errors=["States.ALL"],
        )
        each_group = map_over_groups(self, "time", max_concurrency)
        each_group.item_processor(group)
        return each_group

    def _any_group_failed(self) -> sfn.Pass:
        return sfn.Pass(
            self,
            "AnyGroupFailed",
            parameters={
                "failed": sfn.JsonPath.array_contains(sfn.JsonPath.entire_payload, "failed")
            },
        )

    def _verdict(self) -> sfn.Choice:
        """The run fails if any group failed, and succeeds otherwise."""
        return (
            sfn.Choice(self, "AllGroupsReconciled")
            .when(
                sfn.Condition.boolean_equals("$.failed", True),
                sfn.Fail(
                    self, "SomeGroupsFailed", error="ReconcileFailed", cause="see GroupFailed"
                ),
            )
            .otherwise(sfn.Succeed(self, "Done"))
        )

    def _hourly_run(
        self,
        definition: sfn.IChainable,
        defaults: FunctionDefaults,
        minute: int,
        groups: list[list[int]],
    ) -> tuple[sfn.StateMachine, events.Rule]:
        """The state machine running ``definition`` and the rule starting it every hour at
        ``minute`` past.

        Standard, not Express: one group may take the Lambda's full 15 minutes, past
        Express's 5-minute cap. Standard bills transitions, not duration: a run is the Map,
        two states per group and three after it, 20 at the default 8 groups, so 24 x 30
        runs a month make about 14,400 transitions, $0.36 at $0.025 per 1,000 (less the
        4,000 free ones). Express would bill 15 minutes of each run anyway."""
        return scheduled_over_groups(
            self,
            name="Hourly",
            machine_type=sfn.StateMachineType.STANDARD,
            definition=definition,
            # Within the hour, so that runs never pile up behind a slow one.
            timeout=Duration.seconds(RECONCILE_RUN_TIMEOUT_SECONDS),
            function=self.function,
            log_retention=defaults.log_retention,
            rule_id="EveryHour",
            # Off the top of the hour, when the strict peak materializes and relays.
            schedule=events.Schedule.cron(minute=str(minute)),
            time_key="time",
            groups=groups,
        )

"""Reconciliation: EventBridge hourly -> a Standard state machine -> a Map over the same
shard groups as the materializer -> the reconciler Lambda, one invocation per group."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.data import Access, DataReferences
from infra.functions import FunctionDefaults, log_group, python_function
from infra.materializer import acknowledge_state_machine, map_over_groups, shard_groups

RECONCILE_TIMEOUT = Duration.minutes(15)


class Reconciliation(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        defaults: FunctionDefaults,
        group_size: int,
        max_concurrency: int,
        minute: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = python_function(
            self,
            "Function",
            handler="reconciler.handler.lambda_handler",
            defaults=defaults,
            # Recomputing an hour of expected fires for every schedule of a shard group is
            # the longest job in the system: Lambda's whole 15 minutes.
            timeout=RECONCILE_TIMEOUT,
            # The recomputation is single-threaded Python: 1,769 MB is one full vCPU, the
            # most that code can use.
            memory_mb=1769,
            description="Recomputes expected occurrences of a shard group and repairs gaps",
        )
        # It reads schedule versions and stored occurrences, the materializer's
        # watermarks (what is already planned), and repairs occurrences and usage.
        data.grant(
            self.function,
            Access.READ_WRITE,
            "schedules_table",
            "occurrences_table",
            "tenants_table",
            "leases_table",
        )

        invoke = tasks.LambdaInvoke(
            self,
            "ReconcileGroup",
            lambda_function=self.function,
            payload=sfn.TaskInput.from_object(
                {
                    "time": sfn.JsonPath.string_at("$.time"),
                    "shards": sfn.JsonPath.list_at("$.shards"),
                }
            ),
            result_path=sfn.JsonPath.DISCARD,
            retry_on_service_exceptions=True,
        )
        invoke.add_retry(
            errors=["States.ALL"],
            interval=Duration.seconds(30),
            backoff_rate=2,
            max_attempts=1,
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
        outcome = sfn.Pass(
            self,
            "AnyGroupFailed",
            parameters={
                "failed": sfn.JsonPath.array_contains(sfn.JsonPath.entire_payload, "failed")
            },
        )
        verdict = (
            sfn.Choice(self, "AllGroupsReconciled")
            .when(
                sfn.Condition.boolean_equals("$.failed", True),
                sfn.Fail(
                    self, "SomeGroupsFailed", error="ReconcileFailed", cause="see GroupFailed"
                ),
            )
            .otherwise(sfn.Succeed(self, "Done"))
        )
        # Standard, not Express: one group may take the Lambda's full 15 minutes, past
        # Express's 5-minute cap. Standard bills transitions, not duration: a run is the
        # Map, two states per group and three after it, 20 at the default 8 groups, so
        # 24 x 30 runs a month make about 14,400 transitions, $0.36 at $0.025 per 1,000
        # (less the 4,000 free ones). Express would bill 15 minutes of each run anyway.
        self.state_machine = sfn.StateMachine(
            self,
            "Hourly",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(
                each_group.next(outcome).next(verdict)
            ),
            # Within the hour, so that runs never pile up behind a slow one.
            timeout=Duration.minutes(55),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=log_group(self, "HourlyLogs", defaults.log_retention),
                level=sfn.LogLevel.ERROR,
            ),
        )
        acknowledge_state_machine(self.state_machine, self.function)
        self.rule = events.Rule(
            self,
            "EveryHour",
            # Off the top of the hour, when the strict peak materializes and relays.
            schedule=events.Schedule.cron(minute=str(minute)),
            targets=[
                targets.SfnStateMachine(
                    self.state_machine,
                    input=events.RuleTargetInput.from_object(
                        {
                            "time": events.EventField.time,
                            "groups": shard_groups(data.settings.shard_count, group_size),
                        }
                    ),
                )
            ],
        )

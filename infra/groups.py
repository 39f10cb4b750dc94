"""What the materializer's and the reconciler's workflows share: EventBridge starts a state
machine on a schedule with the event's time and the shard groups, and a Map invokes one
function per group."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.checks import acknowledge
from infra.config import Retry
from infra.functions import log_group


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


def group_invoke(
    scope: Construct,
    construct_id: str,
    function: lambda_.IFunction,
    time_key: str,
    retry: Retry,
    **options: Any,
) -> tasks.LambdaInvoke:
    """One Map iteration's call: the function gets the run's time and its shard group.
    ``retry`` is the only retrier (Lambda's service errors included), so its worst case is
    the whole chain the state machine's timeout must cover (infra/config.py)."""
    invoke = tasks.LambdaInvoke(
        scope,
        construct_id,
        lambda_function=function,
        payload=sfn.TaskInput.from_object(
            {
                time_key: sfn.JsonPath.string_at(f"$.{time_key}"),
                "shards": sfn.JsonPath.list_at("$.shards"),
            }
        ),
        retry_on_service_exceptions=False,
        **options,
    )
    invoke.add_retry(
        errors=["States.ALL"],
        interval=Duration.seconds(retry.interval_seconds),
        backoff_rate=retry.backoff_rate,
        max_attempts=retry.max_attempts,
    )
    return invoke


def scheduled_over_groups(
    scope: Construct,
    *,
    name: str,
    machine_type: sfn.StateMachineType,
    definition: sfn.IChainable,
    timeout: Duration,
    function: lambda_.IFunction,
    log_retention: logs.RetentionDays,
    rule_id: str,
    schedule: events.Schedule,
    time_key: str,
    groups: list[list[int]],
) -> tuple[sfn.StateMachine, events.Rule]:
    """The state machine ``name`` running ``definition`` (traced, errors logged), and the
    rule ``rule_id`` that starts it on ``schedule`` with the event's time and the groups."""
    machine = _state_machine(scope, name, machine_type, definition, timeout, log_retention)
    acknowledge_state_machine(machine, function)
    rule = events.Rule(
        scope,
        rule_id,
        schedule=schedule,
        targets=[
            targets.SfnStateMachine(
                machine,
                input=events.RuleTargetInput.from_object(
                    {time_key: events.EventField.time, "groups": groups}
                ),
            )
        ],
    )
    return machine, rule


def _state_machine(
    scope: Construct,
    name: str,
    machine_type: sfn.StateMachineType,
    definition: sfn.IChainable,
    timeout: Duration,
    log_retention: logs.RetentionDays,
) -> sfn.StateMachine:
    """The state machine ``name``, traced, its errors logged to its own log group."""
    return sfn.StateMachine(
        scope,
        name,
        state_machine_type=machine_type,
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        timeout=timeout,
        tracing_enabled=True,
        logs=sfn.LogOptions(
            # Under /aws/vendedlogs/: CloudWatch Logs then needs no entry for the group in
            # the account's log resource policy, which holds 5,120 characters for every
            # vended log delivery of the account (Step Functions' logging documentation).
            destination=log_group(
                scope,
                f"{name}Logs",
                log_retention,
                f"/aws/vendedlogs/states/{Stack.of(scope).stack_name}-{name}",
            ),
            level=sfn.LogLevel.ERROR,
        ),
    )

"""Materialization: a per-minute rule, an Express state machine mapping over shard groups."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from punctual.domain.ids import shard_groups

from .conftest import (
    Synthesized,
    actions_of,
    machine_definition,
    render,
    resources_of,
    role_statements,
    rule_input,
)

HANDLER = "materializer.handler.lambda_handler"


def test_materializer_rule_fires_every_minute_with_every_shard_group(
    service: Template, synthesized: Synthesized
):
    # THEN an EventBridge rule fires each minute and hands the state machine the tick time
    # and the shard groups (20 shards in groups of 8)
    rules = service.find_resources(
        "AWS::Events::Rule", {"Properties": {"ScheduleExpression": "rate(1 minute)"}}
    )
    assert len(rules) == 1
    target = next(iter(rules.values()))["Properties"]["Targets"][0]
    assert target["RoleArn"]
    payload = rule_input(target)
    assert payload == {"tick": "EVENT_TIME", "groups": shard_groups(20, 8)}
    assert payload["groups"] == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    assert synthesized.config.shard_count == 20


def test_materializer_machine_is_express_mapping_groups_with_bounded_concurrency(
    service: Template,
):
    # GIVEN the Express state machine
    definition = machine_definition(service, "EXPRESS")
    each_group = definition["States"][definition["StartAt"]]
    # THEN it maps over $.groups with the configured concurrency
    assert each_group["Type"] == "Map"
    assert each_group["ItemsPath"] == "$.groups"
    assert each_group["MaxConcurrency"] == 10
    # AND each group's invocation retries with back-off, then is left for the next tick
    # instead of failing the other groups
    processor = each_group["ItemProcessor"]
    task = processor["States"][processor["StartAt"]]
    assert any(r["ErrorEquals"] == ["States.ALL"] and r["BackoffRate"] == 2 for r in task["Retry"])
    assert task["Catch"][0]["Next"] == "GroupLeftForNextTick"
    service.has_resource_properties(
        "AWS::StepFunctions::StateMachine",
        {
            "StateMachineType": "EXPRESS",
            "TracingConfiguration": {"Enabled": True},
            "LoggingConfiguration": Match.object_like({"Level": "ERROR"}),
        },
    )


def test_materializer_function_fits_the_tick(service: Template):
    # THEN the function ends within the one-minute tick
    service.has_resource_properties(
        "AWS::Lambda::Function", {"Handler": HANDLER, "Timeout": 55, "MemorySize": 1024}
    )


def test_materializer_writes_occurrences_and_reads_them_only_to_replan(service: Template):
    # THEN the materializer puts occurrence items (in its transactions), and reads them only
    # by the schedule's partition: a schedule planned under older zone rules is re-planned
    # before its step (punctual.pipeline.rezone, once per schedule and tzdata release); no item
    # read, no scan
    occurrence_actions = {
        action
        for statement in role_statements(service, HANDLER)
        if any("punctual-occurrences" in render(r) for r in resources_of(statement))
        for action in actions_of(statement)
    }
    assert occurrence_actions == {"dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"}


def test_shard_groups_cover_every_shard_once():
    # GIVEN 20 shards in groups of 8; THEN every shard is in exactly one group, in order
    assert shard_groups(20, 8) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    assert [shard for group in shard_groups(64, 8) for shard in group] == list(range(64))


def _function_timeout(service: Template, handler: str) -> int:
    found = service.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}})
    return int(next(iter(found.values()))["Properties"]["Timeout"])


def test_materializer_ticker_outlives_its_groups_whole_retry_chain(service: Template):
    # GIVEN the ticker's one retrier (Lambda's service errors included) and the function's
    # timeout
    definition = machine_definition(service, "EXPRESS")
    processor = definition["States"][definition["StartAt"]]["ItemProcessor"]
    (retrier,) = processor["States"][processor["StartAt"]]["Retry"]
    assert retrier["ErrorEquals"] == ["States.ALL"]
    # WHEN every attempt runs into the timeout, with the waits between
    attempts = retrier["MaxAttempts"] + 1
    waits = sum(
        retrier["IntervalSeconds"] * retrier["BackoffRate"] ** n
        for n in range(retrier["MaxAttempts"])
    )
    chain = attempts * _function_timeout(service, HANDLER) + waits
    # THEN the Express execution still runs when the last attempt ends (a retried group ends
    # retried or caught, not as a timed-out tick), within Express's five minutes
    assert chain < definition["TimeoutSeconds"] <= 300


def test_state_machines_log_under_vendedlogs(service: Template):
    # GIVEN both state machines (the ticker and the hourly run) and the log groups
    groups = service.find_resources("AWS::Logs::LogGroup")
    machines = service.find_resources("AWS::StepFunctions::StateMachine").values()
    destinations = [
        m["Properties"]["LoggingConfiguration"]["Destinations"][0]["CloudWatchLogsLogGroup"]
        for m in machines
    ]
    # THEN each logs to a group under /aws/vendedlogs/ (no entry in the account's 5,120
    # characters of log resource policy), one of its own
    names = [
        groups[d["LogGroupArn"]["Fn::GetAtt"][0]]["Properties"]["LogGroupName"]
        for d in destinations
    ]
    assert len(names) == len(set(names)) == 2
    assert all(n.startswith("/aws/vendedlogs/states/Punctual-") for n in names), names

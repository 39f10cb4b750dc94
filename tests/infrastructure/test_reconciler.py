"""Reconciliation: an hourly rule, a Standard state machine mapping over shard groups."""

from __future__ import annotations

from aws_cdk.assertions import Template

from punctual.domain.ids import shard_groups

from .conftest import machine_definition, rule_input

HANDLER = "reconciler.handler.lambda_handler"


def test_reconciler_rule_runs_hourly_off_the_top_of_the_hour(service: Template):
    # GIVEN reconcile_minute = 25 in the test context
    # THEN one rule fires at minute 25 of every hour with the run time and the
    # reconciler's own (smaller) shard groups
    rules = service.find_resources(
        "AWS::Events::Rule", {"Properties": {"ScheduleExpression": "cron(25 * * * ? *)"}}
    )
    assert len(rules) == 1
    target = next(iter(rules.values()))["Properties"]["Targets"][0]
    payload = rule_input(target)
    assert payload == {"time": "EVENT_TIME", "groups": shard_groups(20, 4)}


def test_reconciler_machine_is_standard_and_fails_visibly_when_a_group_fails(
    service: Template,
):
    # GIVEN the Standard state machine (a group may run Lambda's full 15 minutes)
    definition = machine_definition(service, "STANDARD")
    each_group = definition["States"][definition["StartAt"]]
    # THEN it maps over the groups with the reconciler's own concurrency
    assert each_group["Type"] == "Map"
    assert each_group["MaxConcurrency"] == 3
    assert each_group["ItemSelector"] == {
        "time.$": "$.time",
        "shards.$": "$$.Map.Item.Value",
    }
    # AND a failed group is caught (the others go on) and turns the run into a failure
    processor = each_group["ItemProcessor"]
    task = processor["States"][processor["StartAt"]]
    assert task["Parameters"]["Payload"] == {"time.$": "$.time", "shards.$": "$.shards"}
    assert task["Catch"][0]["Next"] == "GroupFailed"
    verdict = definition["States"][definition["States"][each_group["Next"]]["Next"]]
    assert verdict["Type"] == "Choice"
    assert definition["States"][verdict["Choices"][0]["Next"]]["Type"] == "Fail"
    # AND a run ends within its hour
    assert definition["TimeoutSeconds"] == 55 * 60


def test_reconciler_function_has_lambdas_full_fifteen_minutes(service: Template):
    # THEN the reconciler may run 900 s on one full vCPU
    service.has_resource_properties(
        "AWS::Lambda::Function", {"Handler": HANDLER, "Timeout": 900, "MemorySize": 1769}
    )


def test_reconciler_run_outlives_its_groups_waves_and_one_retry(service: Template):
    # GIVEN the hourly run's groups, its concurrency, its one retrier and the function's
    # timeout, as synthesized
    definition = machine_definition(service, "STANDARD")
    each_group = definition["States"][definition["StartAt"]]
    processor = each_group["ItemProcessor"]
    (retrier,) = processor["States"][processor["StartAt"]]["Retry"]
    assert retrier["ErrorEquals"] == ["States.ALL"]
    rules = service.find_resources(
        "AWS::Events::Rule", {"Properties": {"ScheduleExpression": "cron(25 * * * ? *)"}}
    )
    groups = rule_input(next(iter(rules.values()))["Properties"]["Targets"][0])["groups"]
    functions = service.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": HANDLER}}
    )
    timeout = next(iter(functions.values()))["Properties"]["Timeout"]
    # WHEN every group runs its full timeout, wave after wave, and one group is retried
    waves = -(-len(groups) // each_group["MaxConcurrency"])
    longest = waves * timeout + retrier["IntervalSeconds"] + timeout
    # THEN the run still ends before its state machine's timeout
    assert longest <= definition["TimeoutSeconds"]

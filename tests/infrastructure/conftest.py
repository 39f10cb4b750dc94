"""One offline synthesis (no bundling, no network) of both stacks, shared by every
infrastructure test: a synthesis takes seconds and most of a gigabyte, so it runs once.
The check of the call inventory against what the tests recorded runs last (hooks below)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from infra.config import DeployConfig, committed_context
from infra.offline import cdk_json_context, synthesize
from tests.aws_calls import RECORDER, whole_integration_suite

# Compares the inventory with what this session's integration tests recorded: after them.
RECORDED_CHECK = "test_inventory_is_what_the_integration_tests_recorded"
_deselected: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _deselected.extend(items)


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect have chosen
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    last = [item for item in items if item.name == RECORDED_CHECK]
    items[:] = [item for item in items if item.name != RECORDED_CHECK] + last
    RECORDER.complete = whole_integration_suite(config, items, _deselected)


# Differs from cdk.json's defaults wherever a test must see the value flow through.
TEST_CONTEXT: dict[str, Any] = {
    "shard_count": 20,
    "shard_group_size": 8,
    "map_concurrency": 10,
    "reconcile_concurrency": 3,
    "reconcile_group_size": 4,
    "reconcile_minute": 25,
    "operator_principals": ["arn:aws:iam::123456789012:role/punctual-operator"],
    "api_rate_limit": 300,
    "api_burst_limit": 600,
    "alarm_emails": ["oncall@example.com"],
    "alarms": {
        "strict_lag_p99_seconds": 4,
        "stream_iterator_age_seconds": 45,
        "relay_send_failures": 2,
        "materializer_failures": 1,
        "reconcile_missing": 0,
        "dynamodb_throttles": 10,
        "api_5xx": 7,
        "clock_skew_seconds": 0.5,
    },
}


@dataclass(frozen=True)
class Synthesized:
    config: DeployConfig
    data: Template
    service: Template
    service_json: dict[str, Any]
    report: dict[str, Any]  # the cloud assembly's validation-report.json


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("cdk.out")
    assembly = synthesize(str(outdir), {**cdk_json_context(), "punctual": TEST_CONTEXT})
    templates = {stack.stack_name: stack.template for stack in assembly.stacks}
    return Synthesized(
        config=DeployConfig.from_context(TEST_CONTEXT, base=committed_context()),
        data=Template.from_json(templates["PunctualData"]),
        service=Template.from_json(templates["Punctual"]),
        service_json=templates["Punctual"],
        report=json.loads((Path(assembly.directory) / "validation-report.json").read_text()),
    )


@pytest.fixture(scope="session")
def service(synthesized: Synthesized) -> Template:
    return synthesized.service


@pytest.fixture(scope="session")
def data(synthesized: Synthesized) -> Template:
    return synthesized.data


def function_id(template: Template, handler: str) -> str:
    found = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}})
    assert len(found) == 1, f"one function with handler {handler}"
    return next(iter(found))


def role_statements(template: Template, handler: str) -> list[dict[str, Any]]:
    """Every statement of the policies attached to the role of the function ``handler``."""
    function = template.find_resources("AWS::Lambda::Function")[function_id(template, handler)]
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    policies = template.find_resources(
        "AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": role}]}}
    )
    return [
        statement
        for policy in policies.values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def actions_of(statement: dict[str, Any]) -> list[str]:
    actions = statement["Action"]
    return [actions] if isinstance(actions, str) else list(actions)


def resources_of(statement: dict[str, Any]) -> list[Any]:
    resources = statement["Resource"]
    return resources if isinstance(resources, list) else [resources]


def render(value: Any) -> str:
    """A template value as text with intrinsics spelled as cdk-nag spells them:
    ``{"Ref": "AWS::Region"}`` -> ``<AWS::Region>``, a join -> its parts concatenated."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(render(part) for part in parts)
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return f"<{'.'.join(value['Fn::GetAtt'])}>"
    return json.dumps(value, sort_keys=True)


def machine_definition(template: Template, kind: str) -> dict[str, Any]:
    machines = template.find_resources(
        "AWS::StepFunctions::StateMachine", {"Properties": {"StateMachineType": kind}}
    )
    assert len(machines) == 1
    definition = next(iter(machines.values()))["Properties"]["DefinitionString"]
    # The definition is a join of literal JSON and the function's ARN.
    text = render(definition)
    return dict(json.loads(text))


def rule_input(target: dict[str, Any]) -> dict[str, Any]:
    """The JSON an EventBridge target receives, the event's time spelled "EVENT_TIME"."""
    transformer = target["InputTransformer"]
    assert transformer["InputPathsMap"] == {"time": "$.time"}
    return dict(json.loads(transformer["InputTemplate"].replace("<time>", '"EVENT_TIME"')))

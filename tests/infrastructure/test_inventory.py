"""The call inventory (tests/infrastructure/inventory.txt, recorded by tests/aws_calls.py
while the integration tests run) against the synthesized stack:

- every AWS call a function's code makes is allowed by that function's role, and its role
  allows nothing that no call uses, save the acknowledged grants below;
- every metric an alarm or the dashboard reads is emitted by a function of this stack
  (Punctual's EMF metrics) or names a resource of the stacks (AWS's own metrics);
- the inventory is what this session's integration tests recorded (run last).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from tests.aws_calls import (
    FUNCTIONS,
    RECORDER,
    Call,
    Emitted,
    differences,
    documented_grants,
    grants_table,
    read_inventory,
)

from .conftest import Synthesized, actions_of, render, resources_of, role_statements

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = {function: f"{function}.handler.lambda_handler" for function in FUNCTIONS} | {
    "redrive": "relay.redrive.lambda_handler",
    "drain": "dashboard.drain.lambda_handler",
}
ARN = "arn:<AWS::Partition>:{service}:<AWS::Region>:<AWS::AccountId>:{resource}"

_LOGS = "The Lambda runtime writes the function's own log group with the function's role."
_TRACES = "Active tracing: Lambda and the X-Ray SDK send segments with the function's role."
_STREAM = (
    "The event source mapping reads the outbox stream with the relay's role; ListStreams "
    "has no resource-level permission."
)
_ON_FAILURE = (
    "The event source mapping's on-failure destination: Lambda sends a given-up batch's "
    "stream positions there with the relay's role."
)
_OUTBOX = re.escape(ARN.format(service="dynamodb", resource="table/punctual-occurrences/stream/*"))
# Grants that no boto3 call of the function's code makes: (function or "*", action, the
# rendered resource as a regular expression) -> why the role still needs it.
ACKNOWLEDGED: dict[tuple[str, str, str], str] = {
    ("*", "logs:CreateLogStream", r"<\w+Logs\w+\.Arn>"): _LOGS,
    ("*", "logs:PutLogEvents", r"<\w+Logs\w+\.Arn>"): _LOGS,
    ("*", "xray:PutTraceSegments", r"\*"): _TRACES,
    ("*", "xray:PutTelemetryRecords", r"\*"): _TRACES,
    ("relay", "dynamodb:ListStreams", r"\*"): _STREAM,
    ("relay", "dynamodb:DescribeStream", _OUTBOX): _STREAM,
    ("relay", "dynamodb:GetRecords", _OUTBOX): _STREAM,
    ("relay", "dynamodb:GetShardIterator", _OUTBOX): _STREAM,
    ("relay", "sqs:SendMessage", r"<RelayUndeliveredBatches\w+\.Arn>"): _ON_FAILURE,
    ("relay", "sqs:GetQueueAttributes", r"<RelayUndeliveredBatches\w+\.Arn>"): _ON_FAILURE,
    ("relay", "sqs:GetQueueUrl", r"<RelayUndeliveredBatches\w+\.Arn>"): _ON_FAILURE,
    **{
        ("redrive", f"sqs:{action}", r"<RelayUndeliveredBatches\w+\.Arn>"): (
            "The re-drive's event source mapping polls the on-failure queue with its role."
        )
        for action in (
            "ReceiveMessage",
            "ChangeMessageVisibility",
            "GetQueueUrl",
            "DeleteMessage",
            "GetQueueAttributes",
        )
    },
    **{
        (function, "dynamodb:UpdateItem", r".*:table/punctual-occurrences"): (
            "The relay's send settles an occurrence whose target is gone as DEAD (the relay's "
            "tests make it); the re-drive runs the same code."
        )
        for function in ("redrive",)
    },
    ("api", "dynamodb:GetItem", r".*:table/punctual-idempotency"): (
        "Powertools' idempotency reads the record when a refused put returns none; DynamoDB "
        "returns it with the refusal (ALL_OLD), so no test can make it read, but an older "
        "record format would."
    ),
}


def _iam_match(pattern: str, value: str) -> bool:
    """IAM's wildcards: '*' any run of characters, '?' one character."""
    expression = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(expression, value) is not None


def _arn(call: Call) -> str:
    return ARN.format(service=call.action.split(":")[0], resource=call.resource)


# What the service stack's parameters from the data stack stand for: the outbox stream's
# ARN (its label, the creation time, is known only once the table exists).
PARAMETERS = {
    r"<SsmParameterValuepunctualoccurrencesstreamarn\w+>": ARN.format(
        service="dynamodb", resource="table/punctual-occurrences/stream/*"
    )
}


def _resolved(resource: str) -> str:
    for token, value in PARAMETERS.items():
        if re.fullmatch(token, resource):
            return value
    return resource


def _grants(service: Template, function: str) -> Iterator[tuple[str, str]]:
    """(action, rendered resource) of every Allow of the function's role."""
    for statement in role_statements(service, HANDLERS[function]):
        assert statement["Effect"] == "Allow"
        for action in actions_of(statement):
            for resource in resources_of(statement):
                yield action, _resolved(render(resource))


def _acknowledged(function: str, action: str, resource: str) -> tuple[str, str, str] | None:
    for key in ACKNOWLEDGED:
        who, acknowledged_action, pattern = key
        if (
            who in ("*", function)
            and action == acknowledged_action
            and re.fullmatch(pattern, resource)
        ):
            return key
    return None


@pytest.fixture(scope="module")
def inventory() -> tuple[set[Call], set[Emitted]]:
    return read_inventory()


def test_inventory_every_call_is_allowed_by_its_functions_role(
    service: Template, inventory: tuple[set[Call], set[Emitted]]
):
    calls, _ = inventory
    assert {call.function for call in calls} >= set(FUNCTIONS)
    denied = []
    for function in FUNCTIONS:
        grants = list(_grants(service, function))
        for call in sorted(c for c in calls if c.function == function):
            # THEN some statement of the function's role allows the action on that resource
            if not any(
                _iam_match(action, call.action) and _iam_match(resource, _arn(call))
                for action, resource in grants
            ):
                denied.append(call.line())
    assert not denied, (
        "calls the function's role does not allow (AccessDenied on AWS): grant them in "
        "infra/ next to the function: " + "; ".join(denied)
    )


def test_inventory_every_grant_is_used_by_a_call_or_acknowledged(
    service: Template, inventory: tuple[set[Call], set[Emitted]]
):
    calls, _ = inventory
    unused = []
    used_acknowledgments = set()
    for function in FUNCTIONS:
        mine = [c for c in calls if c.function == function]
        for action, resource in _grants(service, function):
            # THEN the grant serves a recorded call, or it is acknowledged with its reason
            if any(_iam_match(action, c.action) and _iam_match(resource, _arn(c)) for c in mine):
                continue
            key = _acknowledged(function, action, resource)
            if key is None:
                unused.append(f"{function} {action} {resource}")
            else:
                used_acknowledgments.add(key)
    assert not unused, "grants no recorded call uses (least privilege): " + "; ".join(unused)
    # AND every acknowledgment still concerns a grant of the stack
    assert used_acknowledgments == set(ACKNOWLEDGED)


# --- metrics ---------------------------------------------------------------------------------


def _watched(service: Template) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, name, dimensions) of every metric an alarm or the dashboard reads."""
    found = []
    for alarm in service.find_resources("AWS::CloudWatch::Alarm").values():
        properties = alarm["Properties"]
        metrics = [
            query["MetricStat"]["Metric"]
            for query in properties.get("Metrics", [])
            if "MetricStat" in query
        ] or [properties]
        for metric in metrics:
            dimensions = {d["Name"]: render(d["Value"]) for d in metric.get("Dimensions", [])}
            found.append((metric["Namespace"], metric["MetricName"], dimensions))
    for dashboard in service.find_resources("AWS::CloudWatch::Dashboard").values():
        body = json.loads(render(dashboard["Properties"]["DashboardBody"]))
        for widget in body["widgets"]:
            for line in widget["properties"].get("metrics", []):
                if isinstance(line[0], str):  # not a math expression
                    namespace, name, *rest = [part for part in line if isinstance(part, str)]
                    found.append((namespace, name, dict(zip(rest[::2], rest[1::2], strict=True))))
    return found


def test_metrics_every_punctual_metric_watched_is_emitted_by_a_function(
    service: Template, inventory: tuple[set[Call], set[Emitted]]
):
    # GIVEN the EMF metrics each function of this stack emitted in the tests (the worker
    # SDK's are emitted in the accounts where workers run, not here)
    _, metrics = inventory
    emitted = {(m.namespace, m.name, m.dimensions) for m in metrics if m.function in FUNCTIONS}
    watched = [m for m in _watched(service) if not m[0].startswith("AWS/")]
    assert len(watched) >= 20
    # THEN every metric an alarm or the dashboard reads is one of them, dimensions included
    missing = sorted(
        {
            f"{namespace} {name} {dimensions}"
            for namespace, name, dimensions in watched
            if (namespace, name, ",".join(f"{k}={v}" for k, v in sorted(dimensions.items())))
            not in emitted
        }
    )
    assert not missing, "watched but emitted by no function of this stack: " + "; ".join(missing)


def test_metrics_every_aws_metric_watched_names_a_resource_of_the_stacks(
    synthesized: Synthesized,
):
    service = synthesized.service
    # GIVEN the resources AWS publishes metrics for, as the template names them
    refs: dict[str, set[str]] = {
        kind: {f"<{logical_id}>" for logical_id in service.find_resources(kind)}
        for kind in (
            "AWS::Lambda::Function",
            "AWS::StepFunctions::StateMachine",
            "AWS::Events::Rule",
        )
    }
    queues = {
        f"<{logical_id}.QueueName>" for logical_id in service.find_resources("AWS::SQS::Queue")
    }
    (api,) = service.find_resources("AWS::ApiGateway::RestApi").values()
    tables = {
        table["Properties"]["TableName"]: {
            index["IndexName"] for index in table["Properties"].get("GlobalSecondaryIndexes", [])
        }
        for table in synthesized.data.find_resources("AWS::DynamoDB::Table").values()
    }
    expected: dict[str, Any] = {
        "AWS/Lambda": lambda d: (
            set(d) == {"FunctionName"} and d["FunctionName"] in refs["AWS::Lambda::Function"]
        ),
        "AWS/States": lambda d: (
            set(d) == {"StateMachineArn"}
            and d["StateMachineArn"] in refs["AWS::StepFunctions::StateMachine"]
        ),
        "AWS/SQS": lambda d: set(d) == {"QueueName"} and d["QueueName"] in queues,
        "AWS/Events": lambda d: (
            set(d) == {"RuleName"} and d["RuleName"] in refs["AWS::Events::Rule"]
        ),
        "AWS/ApiGateway": lambda d: d == {"ApiName": api["Properties"]["Name"]},
        "AWS/DynamoDB": lambda d: (
            set(d) <= {"TableName", "GlobalSecondaryIndexName"}
            and d["TableName"] in tables
            and d.get("GlobalSecondaryIndexName") in {None, *tables[d["TableName"]]}
        ),
    }
    # THEN each AWS metric watched identifies one of them by its dimensions
    for namespace, name, dimensions in _watched(service):
        if namespace.startswith("AWS/"):
            assert expected[namespace](dimensions), (namespace, name, dimensions)
    # AND the API is named after its stack, not plainly "Rest"
    assert api["Properties"]["Name"] == "Punctual"


# --- the inventory is what the tests recorded (run last: tests/infrastructure/conftest.py) ---


def test_inventory_is_what_the_integration_tests_recorded(
    inventory: tuple[set[Call], set[Emitted]],
):
    if not (RECORDER.calls or RECORDER.metrics):
        pytest.skip("no integration test ran in this session: nothing was recorded")
    new, stale = differences((RECORDER.calls, RECORDER.metrics), inventory)
    # THEN every call and metric recorded is listed
    assert not new, (
        "recorded but not in tests/infrastructure/inventory.txt: grant each call in infra/ "
        "next to its function, then `make inventory`: " + "; ".join(new)
    )
    # AND, when every integration test ran, every line listed was recorded
    if RECORDER.complete:
        assert not stale, (
            "in the inventory but no longer made: remove its grant, then `make inventory`: "
            + "; ".join(stale)
        )


def test_deploy_docs_grants_table_is_the_inventorys():
    # GIVEN docs/deploy.md's table of what each function's role allows
    documented = documented_grants((ROOT / "docs" / "deploy.md").read_text(encoding="utf-8"))
    # THEN it is the one the inventory gives (regenerate: python -m tests.aws_calls --grants)
    assert documented == grants_table(read_inventory()[0])

"""The call recorder (tests/aws_calls.py): which function a call belongs to, and how IAM
spells it. Code "of" a function is compiled here under that function's file name, which is
all the attribution reads."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests import aws_calls
from tests.aws_calls import function_of, iam_requests

ROOT = Path(aws_calls.__file__).resolve().parent.parent
RELAY = ROOT / "layers" / "core" / "python" / "punctual" / "pipeline" / "relay.py"
PLANE = ROOT / "layers" / "core" / "python" / "punctual" / "control" / "plane.py"
MATERIALIZER = ROOT / "layers" / "core" / "python" / "punctual" / "pipeline" / "materializer.py"


def code_of(path: Path, source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"sys": sys, "function_of": function_of}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


def probe(operation: str | None = None) -> str | None:
    """What the recorder would attribute a call made here to."""
    return function_of(sys._getframe(1), operation)


def test_aws_calls_a_functions_class_makes_the_call_its_own():
    # GIVEN the relay's class calling AWS (through any helper of the layer)
    relay = code_of(RELAY, "class Relay:\n    def send(self, probe):\n        return probe()\n")
    # THEN the call is the relay's; the test's own call is nobody's
    assert relay["Relay"]().send(lambda: probe()) is None  # the lambda is test code
    assert relay["Relay"]().send(probe) == "relay"
    assert probe() is None


def test_aws_calls_a_module_function_of_a_functions_file_is_not_an_entry_point():
    # GIVEN a module function of a function's file (as read_reports is), called by a test
    module = code_of(MATERIALIZER, "def helper(probe):\n    return probe()\n")
    # THEN the call is the test's (the API calls it too, from its own entry point)
    assert module["helper"](probe) is None


def test_aws_calls_a_test_callback_inside_a_function_starts_over():
    # GIVEN the materializer calling a test hook, which calls the control plane (an API
    # change racing a step)
    materializer = code_of(
        MATERIALIZER, "class Materializer:\n    def run(self, hook):\n        return hook()\n"
    )
    plane = code_of(
        PLANE, "class ControlPlane:\n    def cancel(self, probe):\n        return probe()\n"
    )

    def hook() -> str | None:
        attributed: str | None = plane["ControlPlane"]().cancel(probe)
        return attributed

    # THEN the control plane's call is the API's, not the materializer's
    assert materializer["Materializer"]().run(hook) == "api"


def test_aws_calls_a_spy_forwarding_the_operation_is_looked_through():
    relay = code_of(
        RELAY,
        "class Relay:\n    def send(self, client):\n        return client.send_message_batch()\n",
    )

    class Spy:
        def send_message_batch(self) -> str | None:
            return probe("send_message_batch")

    class Other:
        def send_message_batch(self) -> str | None:
            return probe("delete_message_batch")  # not a forward of the same operation

    assert relay["Relay"]().send(Spy()) == "relay"
    assert relay["Relay"]().send(Other()) is None


def test_aws_calls_work_handed_to_a_thread_pool_keeps_its_function(
    monkeypatch: pytest.MonkeyPatch,
):
    # GIVEN the recorder's pool wrapper, and the relay handing test code to a pool
    monkeypatch.setattr(
        ThreadPoolExecutor,
        "submit",
        aws_calls._submit_keeping_attribution(ThreadPoolExecutor.submit),
    )
    relay = code_of(
        RELAY,
        "class Relay:\n"
        "    def fan_out(self, pool, work):\n"
        "        return pool.submit(work).result()\n",
    )

    def library_code() -> str | None:  # a thread's own stack holds no entry point
        return function_of(None)

    with ThreadPoolExecutor(max_workers=1) as pool:
        # THEN the pool thread's call is the relay's
        assert relay["Relay"]().fan_out(pool, library_code) == "relay"
        assert pool.submit(library_code).result() is None


@pytest.mark.parametrize(
    ("service", "operation", "params", "expected"),
    [
        (
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": [
                    {"Put": {"TableName": "punctual-occurrences"}},
                    {"Update": {"TableName": "t0123456789-schedules_table"}},
                    {"ConditionCheck": {"TableName": "punctual-leases"}},
                ]
            },
            [
                ("dynamodb:PutItem", "table/punctual-occurrences"),
                ("dynamodb:UpdateItem", "table/punctual-schedules"),
                ("dynamodb:ConditionCheckItem", "table/punctual-leases"),
            ],
        ),
        (
            "dynamodb",
            "Query",
            {"TableName": "punctual-schedules", "IndexName": "due"},
            [("dynamodb:Query", "table/punctual-schedules/index/due")],
        ),
        (
            "dynamodb",
            "BatchGetItem",
            {"RequestItems": {"punctual-leases": {}, "punctual-tenants": {}}},
            [
                ("dynamodb:BatchGetItem", "table/punctual-leases"),
                ("dynamodb:BatchGetItem", "table/punctual-tenants"),
            ],
        ),
        (
            "sqs",
            "SendMessageBatch",
            {"QueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/punctual-a-b"},
            [("sqs:SendMessage", "punctual-*")],
        ),
        (
            "sqs",
            "CreateQueue",
            {"QueueName": "punctual-a-b-dlq", "tags": {"tenant": "a"}},
            [("sqs:CreateQueue", "punctual-*"), ("sqs:TagQueue", "punctual-*")],
        ),
        ("sqs", "GetQueueUrl", {"QueueName": "other"}, [("sqs:GetQueueUrl", "other")]),
    ],
)
def test_aws_calls_are_spelled_as_iam_authorizes_them(
    service: str, operation: str, params: dict[str, Any], expected: list[tuple[str, str]]
):
    # THEN a transaction needs each item's own action, a batch each table's, a query on an
    # index the index's ARN, a batch send SendMessage, a tagged queue creation TagQueue
    assert iam_requests(service, operation, params) == expected


def test_aws_calls_an_unknown_service_is_refused_not_ignored():
    # THEN a call the recorder cannot spell fails the run instead of going unrecorded
    with pytest.raises(AssertionError, match="teach"):
        iam_requests("kms", "Decrypt", {})


def test_a_request_value_outside_its_enum_is_found_as_aws_would_refuse_it():
    import boto3

    model = boto3.client("dynamodb", region_name="us-east-1").meta.service_model
    transact = model.operation_model("TransactWriteItems").input_shape

    def update(returned: str) -> dict[str, Any]:
        return {
            "TransactItems": [
                {"ConditionCheck": {"TableName": "t", "Key": {}, "ConditionExpression": "x"}},
                {
                    "Update": {
                        "TableName": "t",
                        "Key": {"pk": {"S": "a"}},
                        "UpdateExpression": "SET a = :a",
                        "ExpressionAttributeValues": {":a": {"S": "ALL_OLD_is_just_data"}},
                        "ReturnValuesOnConditionCheckFailure": returned,
                    }
                },
            ]
        }

    # GIVEN a transaction whose second action asks for its old image, spelled as AWS spells
    # it, misspelled, and in lower case (DynamoDB's enums are case-sensitive)
    # THEN only the misspellings are found, with where they are and what AWS takes
    assert aws_calls.enum_violations(transact, update("ALL_OLD")) == []
    assert aws_calls.enum_violations(transact, update("all_old")) == [
        "TransactItems[1].Update.ReturnValuesOnConditionCheckFailure = 'all_old', "
        "not one of ALL_OLD, NONE"
    ]
    assert len(aws_calls.enum_violations(transact, update("XXALL_OLDXX"))) == 1
    # ... and a plain string (an attribute's value) is never taken for one
    get = model.operation_model("GetItem").input_shape
    assert aws_calls.enum_violations(get, {"TableName": "NONE", "Key": {"a": {"S": "x"}}}) == []

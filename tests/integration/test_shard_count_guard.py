"""The shard-count guard (infra/guard_handler.py, the data stack's custom resource): a
deploy with fewer shards than deployed before fails, naming the shards it would orphan,
and leaves the recorded count as it was; the same or a larger count is recorded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra import guard_handler
from punctual.services import Services


def event(kind: str, count: int, table: str) -> dict[str, Any]:
    return {
        "RequestType": kind,
        "ResourceProperties": {"ShardCount": str(count), "Table": table},
        "ResponseURL": "https://cloudformation.example/answer",
        "StackId": "stack",
        "RequestId": "request",
        "LogicalResourceId": "Guard",
    }


def recorded(aws: Services) -> int:
    item = aws.dynamodb.get_item(TableName=aws.settings.leases_table, Key=guard_handler.KEY)
    return int(item["Item"]["shard_count"]["N"])


def test_guard_records_the_count_and_refuses_a_smaller_one(aws: Services):
    table = aws.settings.leases_table
    # GIVEN a first deploy of 128 shards
    assert guard_handler.decide(event("Create", 128, table), aws.dynamodb)[0] == "SUCCESS"
    assert recorded(aws) == 128
    # WHEN a later deploy asks for 64 (an override that forgot the shard count)
    status, reason = guard_handler.decide(event("Update", 64, table), aws.dynamodb)
    # THEN it fails, naming the shards it would orphan and what to deploy instead, and the
    # record keeps 128 (CloudFormation's rollback then asks for 128 again: accepted)
    assert status == "FAILED"
    assert "shards 64-127 would never fire again" in reason
    assert "shard_count 128 or more" in reason
    assert recorded(aws) == 128
    assert guard_handler.decide(event("Update", 128, table), aws.dynamodb)[0] == "SUCCESS"
    # AND a stack made anew over the kept tables is held to the same count
    assert guard_handler.decide(event("Create", 100, table), aws.dynamodb)[0] == "FAILED"
    # AND more shards are recorded; deleting the stack keeps the record
    assert guard_handler.decide(event("Update", 256, table), aws.dynamodb)[0] == "SUCCESS"
    assert recorded(aws) == 256
    assert guard_handler.decide(event("Delete", 8, table), aws.dynamodb)[0] == "SUCCESS"
    assert recorded(aws) == 256


def test_guard_answers_cloudformation_even_when_it_cannot_read(
    aws: Services, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a guard whose table does not exist (a failure of its own, not a refusal)
    sent: list[dict[str, Any]] = []

    class Answered:
        def __init__(self, request: Any, timeout: float) -> None:
            sent.append(
                {"url": request.full_url, "method": request.method, **json.loads(request.data)}
            )

        def __enter__(self) -> Answered:
            return self

        def __exit__(self, *_: object) -> None:
            return None

    monkeypatch.setattr("urllib.request.urlopen", Answered)
    monkeypatch.setattr("boto3.client", lambda _: aws.dynamodb)
    # WHEN CloudFormation asks it
    guard_handler.on_event(event("Update", 64, "no-such-table"), None)
    # THEN it answers FAILED with the error, at the URL CloudFormation gave (a guard that
    # raised would leave the stack waiting an hour)
    [answer] = sent
    assert (answer["url"], answer["method"], answer["Status"]) == (
        "https://cloudformation.example/answer",
        "PUT",
        "FAILED",
    )
    assert "ResourceNotFound" in answer["Reason"]
    assert (answer["RequestId"], answer["LogicalResourceId"]) == ("request", "Guard")

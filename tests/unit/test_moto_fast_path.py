"""tests/conftest.py writes moto's plain DynamoDB AttributeValues as they are: the answers
must be exactly what moto's own serializer gives."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core.serialize import BaseJSONSerializer

ITEMS: list[dict[str, Any]] = [
    {"pk": {"S": "plain"}, **{f"m{i:02d}": {"N": str(i)} for i in range(60)}},
    {
        "pk": {"S": "nested"},
        "map": {"M": {"a": {"N": "1.5"}, "b": {"L": [{"S": "x"}, {"BOOL": False}]}}},
        "null": {"NULL": True},
        "strings": {"SS": ["a", "b"]},
        "numbers": {"NS": ["1", "2"]},
        "empty": {"M": {}},
        "list": {"L": []},
    },
    # Binary is not plain: moto's own path writes it (base64).
    {"pk": {"S": "binary"}, "blob": {"B": b"\x00\x01"}, "in_map": {"M": {"b": {"B": b"x"}}}},
]


def _answers() -> list[Any]:
    with mock_aws():
        client = boto3.client(
            "dynamodb",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        answers: list[Any] = []
        for item in ITEMS:
            client.put_item(TableName="t", Item=item)
            answers.append(client.get_item(TableName="t", Key={"pk": item["pk"]}))
        answers.append(client.scan(TableName="t"))
        answers.append(
            client.update_item(
                TableName="t",
                Key={"pk": {"S": "plain"}},
                UpdateExpression="SET m01 = m01 + :one",
                ExpressionAttributeValues={":one": {"N": "1"}},
                ReturnValues="ALL_NEW",
            )
        )
        for answer in answers:
            answer.pop("ResponseMetadata")
        return answers


def test_moto_fast_path_answers_exactly_what_motos_serializer_answers(
    monkeypatch: pytest.MonkeyPatch,
):
    # GIVEN the fast path tests/conftest.py installed
    fast = BaseJSONSerializer._serialize_type_structure
    assert hasattr(fast, "moto_original"), "the fast path is not installed (another moto?)"
    patched = _answers()
    # WHEN the same calls are answered by moto's own serializer
    monkeypatch.setattr(BaseJSONSerializer, "_serialize_type_structure", fast.moto_original)
    original = _answers()
    # THEN every answer is the same, binary included
    assert patched == original
    assert patched[0]["Item"] == ITEMS[0]

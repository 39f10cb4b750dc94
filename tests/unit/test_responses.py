"""DynamoDB's responses as the functions' clients parse them (punctual.dal.responses), items
as from_dynamo reads them and as to_dynamo writes them: exactly what botocore's own parser
and boto3's TypeDeserializer and TypeSerializer give, for every kind of value, for less
CPU."""

from __future__ import annotations

import base64
import json
import random
from decimal import Decimal
from enum import StrEnum
from typing import Any

import botocore.session
import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.parsers import create_parser
from hypothesis import given, settings
from hypothesis import strategies as st

from punctual.dal.common import _native, _plain, from_dynamo, to_dynamo, values
from punctual.dal.responses import ValuesAsSent

BLOB = base64.b64encode(b"\x00\x01binary").decode()
ITEM = {
    "s": {"S": "text"},
    "n": {"N": "12"},
    "f": {"N": "1.5"},
    "e": {"N": "1E+2"},
    "z": {"N": "-0"},
    "t": {"BOOL": True},
    "nul": {"NULL": True},
    "ss": {"SS": ["a", "b"]},
    "ns": {"NS": ["1", "2.5"]},
    "b": {"B": BLOB},
    "bs": {"BS": [BLOB]},
    "m": {"M": {"inner": {"L": [{"S": "x"}, {"N": "3"}, {"M": {"deep": {"B": BLOB}}}]}}},
    "l": {"L": []},
}


class Kind(StrEnum):
    A = "a"


_MODEL = botocore.session.get_session().get_service_model("dynamodb")


def parsed(operation: str, body: dict[str, Any], *, fast: bool, status: int = 200) -> Any:
    parser = ValuesAsSent().create_parser("json") if fast else create_parser("json")
    response = {
        "status_code": status,
        "headers": {"x-amzn-requestid": "r"},
        "body": json.dumps(body).encode(),
    }
    shape = _MODEL.operation_model(operation).output_shape
    if status >= 400:  # the modeled fields, as botocore's second pass reads them
        shape = _MODEL.shape_for_error_code(body["__type"])
    return parser.parse(response, shape)


@pytest.mark.parametrize(
    ("operation", "body"),
    [
        ("GetItem", {"Item": ITEM}),
        ("Query", {"Items": [ITEM, ITEM], "Count": 2, "LastEvaluatedKey": {"s": {"S": "k"}}}),
        ("BatchGetItem", {"Responses": {"t": [ITEM]}, "UnprocessedKeys": {}}),
        ("UpdateItem", {"Attributes": ITEM, "ConsumedCapacity": {"TableName": "t"}}),
        ("GetItem", {}),
    ],
)
def test_a_response_parses_as_botocores_own_parser_gives_it(operation: str, body: Any) -> None:
    assert parsed(operation, body, fast=True) == parsed(operation, body, fast=False)


def test_a_refusal_carries_its_item_as_botocore_gives_it() -> None:
    # (ConditionalCheckFailed with ReturnValuesOnConditionCheckFailure: ConditionFailed's item)
    body = {"__type": "ConditionalCheckFailedException", "message": "no", "Item": ITEM}
    fast = parsed("PutItem", body, fast=True, status=400)
    assert fast == parsed("PutItem", body, fast=False, status=400)
    assert fast["Item"]["b"] == {"B": b"\x00\x01binary"}


def test_another_protocol_is_parsed_by_botocore() -> None:
    assert type(ValuesAsSent().create_parser("query")) is type(create_parser("query"))


def test_dynamodbs_protocol_gets_the_parser_that_hands_values_on_as_sent() -> None:
    assert type(ValuesAsSent().create_parser("json")) is not type(create_parser("json"))


def test_an_attribute_value_in_any_response_is_a_maps_value() -> None:
    # (what the parser takes over: every other place would be left to botocore's walk)
    parents: set[str] = set()
    seen: set[tuple[str, str]] = set()

    def walk(shape: Any, parent: str) -> None:
        if shape.name == "AttributeValue":
            parents.add(parent)
        elif (shape.name, parent) not in seen:
            seen.add((shape.name, parent))
            members: list[Any] = []
            if shape.type_name == "structure":
                members = list(shape.members.values())
            elif shape.type_name == "list":
                members = [shape.member]
            elif shape.type_name == "map":
                members = [shape.value]
            for member in members:
                walk(member, shape.type_name)

    outputs = [_MODEL.operation_model(op).output_shape for op in _MODEL.operation_names]
    for shape in [s for s in outputs if s is not None] + list(_MODEL.error_shapes):
        walk(shape, "response")
    assert parents == {"map"}


def test_from_dynamo_reads_every_kind_of_value_as_the_type_deserializer_does() -> None:
    wire = parsed("GetItem", {"Item": ITEM}, fast=True)["Item"]
    slow = {k: _native(TypeDeserializer().deserialize(v)) for k, v in wire.items()}
    fast = from_dynamo(wire)
    assert fast == slow
    assert [type(fast[k]) for k in ("n", "f", "e", "z")] == [int, float, int, int]
    assert fast["ns"] == {Decimal(1), Decimal("2.5")}  # sets keep boto3's Decimals


def test_from_dynamo_numbers_match_on_random_values() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        text = rng.choice(
            [
                str(rng.randint(-(10**30), 10**30)),
                f"{rng.uniform(-1e6, 1e6):.6f}",
                f"{rng.randint(1, 9)}E+{rng.randint(0, 20)}",
                f"{rng.randint(1, 9)}.{rng.randint(0, 99)}E-{rng.randint(0, 5)}",
            ]
        )
        typed = {"N": text}
        expected = _native(TypeDeserializer().deserialize(typed))
        got = from_dynamo({"v": typed})["v"]
        assert (got, type(got)) == (expected, type(expected)), text


def _as_boto3_writes(item: dict[str, Any]) -> Any:
    """What to_dynamo gave before its fast path: boto3's TypeSerializer over _plain."""
    serializer = TypeSerializer()
    return {k: serializer.serialize(_plain(v)) for k, v in item.items() if v is not None}


_SCALARS = st.one_of(
    st.text(max_size=5),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([10**38 - 1, -(10**38) + 1, 10**38, -(10**38), 10**40, 0, True, False]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=3, max_value=10**6, min_value=-(10**6)
    ),
    st.binary(max_size=3),
    st.frozensets(st.text(min_size=1, max_size=3), min_size=1, max_size=3).map(set),
    st.sampled_from([Kind.A]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _VALUES, max_size=4))
def test_to_dynamo_writes_every_kind_of_value_as_the_type_serializer_does(item: Any) -> None:
    try:
        expected = _as_boto3_writes(item)
    except Exception as error:  # boto3 refuses it (a number past 38 digits): so must we
        with pytest.raises(type(error)):
            to_dynamo(item)
        return
    assert to_dynamo(item) == expected
    assert values(**{f"v{i}": v for i, v in enumerate(item.values())}) == {
        f":v{i}": TypeSerializer().serialize(_plain(v)) for i, v in enumerate(item.values())
    }

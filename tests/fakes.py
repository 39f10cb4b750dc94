"""Test stand-ins typed as what they stand in for."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


def as_client(fake: object) -> DynamoDBClient:
    """A test's stand-in for a DynamoDB client (a stub, a recorder, a throttling one), typed
    as the client: it answers only the calls its test makes."""
    return cast("DynamoDBClient", fake)

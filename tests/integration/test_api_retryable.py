"""Every read of the API throttled or unanswered as AWS may throttle it: 503 with the
documented error (docs/openapi.json: "retry with back-off"), never a 500."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from api import context
from botocore.exceptions import ReadTimeoutError

from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, client_error
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import assert_error, create, cron


@pytest.fixture
def failing(aws: Services, clock: Clock) -> Iterator[dict[str, Any]]:
    """The API over a DynamoDB whose calls of the operations named in the returned dict
    (operation -> the error to raise) fail before they run."""
    faults = Faults(FaultPlan.none(), clock)
    failures: dict[str, Exception] = {}

    def fail(operation: str, request: dict[str, Any]) -> None:
        if operation in failures:
            raise failures[operation]

    for operation in ("get_item", "query", "batch_get_item"):
        faults.before[operation] = fail
    context.configure(dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults)))
    yield failures
    context.configure(aws)


@pytest.mark.parametrize(
    ("operation", "error"),
    [
        ("get_item", client_error("ThrottlingException", "GetItem")),
        ("get_item", client_error("ProvisionedThroughputExceededException", "GetItem")),
        ("get_item", ReadTimeoutError(endpoint_url="https://dynamodb")),
        ("query", client_error("ThrottlingException", "Query")),
        ("batch_get_item", client_error("InternalServerError", "BatchGetItem")),
    ],
)
def test_api_a_read_dynamodb_throttles_or_leaves_unanswered_is_503(
    alice: Api, failing: dict[str, Any], operation: str, error: Exception
):
    # GIVEN a schedule with an occurrence
    sid = create(alice, cron("* * * * *"))["schedule"]["schedule_id"]
    listed = alice.get(f"/v1/schedules/{sid}/occurrences").body["occurrences"]
    # WHEN DynamoDB fails that read
    failing[operation] = error
    answers = [
        alice.get(f"/v1/schedules/{sid}"),
        alice.get("/v1/schedules"),
        alice.get(f"/v1/schedules/{sid}/occurrences"),
        alice.get(f"/v1/occurrences/{listed[0]['occurrence_id']}"),
    ]
    # THEN every request that made it answers 503 (retry), as the document promises; the
    # others answered as usual
    statuses = [a.status for a in answers]
    assert 503 in statuses
    assert set(statuses) <= {200, 503}, [a.body for a in answers]
    for answer in answers:
        if answer.status == 503:
            assert_error(answer, 503, "retry")

"""The API Lambda driven with API Gateway REST proxy events, on moto's DynamoDB and SQS."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import boto3
import pytest
from api import context, handler
from moto import mock_aws

from punctual.clients import aws_client
from punctual.dal.tables import ALL_TABLES, create_tables
from punctual.services import Services
from punctual.settings import Settings
from punctual_local import gateway
from punctual_local.dynamodb import LocalDynamoDB
from punctual_local.dynamodb import shared as shared_dynamodb_local
from tests.aws_calls import record_aws_calls  # noqa: F401  (records every function's AWS calls)

OPERATOR = "arn:aws:iam::111122223333:user/operator"
ALICE = "arn:aws:iam::111122223333:user/alice"
BOB = "arn:aws:iam::111122223333:user/bob"
START = 1_795_000_000  # 2026-11-18T11:06:40Z


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class LambdaContextStub:
    function_name = "api"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:111122223333:function:api"
    aws_request_id = "req-1"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 30_000


def rest_event(
    method: str,
    path: str,
    principal: str | None,
    body: Any = None,
    query: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The local gateway's REST proxy event (one definition), from test-friendly arguments."""
    return gateway.rest_event(
        method,
        path,
        principal,
        None if body is None else json.dumps(body),
        {k: [str(v)] for k, v in (query or {}).items() if v is not None},
        headers,
    )


class Api:
    """Calls the real Lambda handler as API Gateway would."""

    def __init__(self, principal: str | None) -> None:
        self.principal = principal

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Answer:
        event = rest_event(method, path, self.principal, body, **kwargs)
        result = handler.lambda_handler(event, LambdaContextStub())
        raw = result.get("body")
        headers = result.get("headers") or {
            k: v[-1] for k, v in result.get("multiValueHeaders", {}).items()
        }
        return Answer(result["statusCode"], json.loads(raw) if raw else None, headers)

    def get(self, path: str, **query: Any) -> Answer:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Answer:
        return self.call("POST", path, body if body is not None else {}, **kwargs)

    def as_query(self, **query: Any) -> str:
        return urlencode(query)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def settings() -> Settings:
    return Settings(operator_principals=frozenset({OPERATOR}), shard_count=8)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, clock: Clock, settings: Settings) -> Iterator[Services]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    with mock_aws():
        # As the functions' client (its parser), with botocore's request check kept on.
        dynamodb = aws_client("dynamodb", checked=True, region_name="us-east-1")
        yield from _configured(dynamodb, settings, clock)


def _configured(dynamodb: Any, settings: Settings, clock: Clock) -> Iterator[Services]:
    """Fresh tables, moto's SQS (inside mock_aws), and the API configured with them."""
    create_tables(dynamodb, settings)
    services = Services(
        dynamodb=dynamodb,
        sqs=boto3.client("sqs", region_name="us-east-1"),
        settings=settings,
        now=clock,
        # Retries pause on the injected clock's terms: not at all (a test of the back-off
        # itself passes a sleep that records).
        sleep=lambda seconds: None,
    )
    context.configure(services)
    yield services
    context.configure(None)


def bootstrap(tenant_id: str, principal: str, **quotas: int) -> Api:
    """An operator creates the tenant, binds its principal, and the tenant makes a target."""
    operator = Api(OPERATOR)
    body: dict[str, Any] = {"tenant_id": tenant_id}
    if quotas:
        body["quotas"] = quotas
    assert operator.post("/v1/admin/tenants", body).status == 201
    bound = operator.post(f"/v1/admin/tenants/{tenant_id}/principals", {"principal_arn": principal})
    assert bound.status == 200, bound.body
    api = Api(principal)
    assert api.post("/v1/targets", {"name": "default"}).status == 201
    return api


@pytest.fixture
def alice(aws: Services) -> Api:
    return bootstrap("alice", ALICE)


@pytest.fixture
def bob(aws: Services) -> Api:
    return bootstrap("bob", BOB)


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[LocalDynamoDB]:
    """DynamoDB Local (make tools installs it; make test depends on it): AWS's own engine,
    for races that need real transaction isolation, which moto does not promise."""
    engine = shared_dynamodb_local()
    yield engine
    engine.stop()


@pytest.fixture
def local_aws(
    dynamodb_local: LocalDynamoDB, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Services]:
    """Services on DynamoDB Local (fresh tables per test) and moto's SQS."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings(operator_principals=frozenset({OPERATOR}), shard_count=8).model_copy(
        update={spec.setting: f"{prefix}-{spec.setting}" for spec in ALL_TABLES}
    )
    with mock_aws():
        yield from _configured(dynamodb_local.client(), settings, clock)


@pytest.fixture
def streams(local_aws: Services, dynamodb_local: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """DynamoDB Streams through boto3 against DynamoDB Local."""
    monkeypatch.setenv("AWS_ACCOUNT_ID_ENDPOINT_MODE", "disabled")
    return boto3.client(
        "dynamodbstreams",
        endpoint_url=dynamodb_local.endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )

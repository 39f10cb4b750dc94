"""Per-process wiring of the API: the control plane, the caller, idempotent create."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, cast

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from api.views import saved_out
from punctual.errors import Forbidden
from punctual.models import ScheduleDefinition
from punctual.scheduling import ControlPlane, Services

IDEMPOTENCY_TTL_SECONDS = 24 * 3600
# Registered with each invocation's Lambda context (handler.py), so that a create cut off
# by the Lambda timeout frees its key when the invocation would have ended.
IDEMPOTENCY = IdempotencyConfig(
    event_key_jmespath="key",
    payload_validation_jmespath="body",
    expires_after_seconds=IDEMPOTENCY_TTL_SECONDS,
)

_services: Services | None = None


def configure(services: Services | None) -> None:
    """Use these services (tests, the local stack); None: build from the environment."""
    global _services
    _services = services
    plane.cache_clear()
    idempotent_create.cache_clear()


def services() -> Services:
    global _services
    if _services is None:
        _services = Services.from_environment()
    return _services


@cache
def plane() -> ControlPlane:
    return ControlPlane(services())


def caller_arn(app: BaseRouter) -> str:
    event = app.current_event
    assert isinstance(event, APIGatewayProxyEvent)  # REST API events only
    arn = event.request_context.identity.user_arn
    if not arn:
        raise Forbidden("the request is not signed with IAM credentials")
    return str(arn)


def caller_tenant(app: BaseRouter) -> str:
    """The tenant comes from the signed principal only, never from the request body."""
    return plane().tenant_of(caller_arn(app))


def require_operator(app: BaseRouter) -> None:
    if not plane().is_operator(caller_arn(app)):
        raise Forbidden("operator only")


@cache
def idempotent_create() -> Callable[..., dict[str, Any]]:
    """Create, remembered per (tenant, Idempotency-Key) for a day with a body fingerprint."""
    persistence = DynamoDBPersistenceLayer(
        table_name=services().settings.idempotency_table, boto3_client=services().dynamodb
    )

    @idempotent_function(
        data_keyword_argument="request", persistence_store=persistence, config=IDEMPOTENCY
    )
    def create(request: dict[str, Any]) -> dict[str, Any]:
        definition = ScheduleDefinition.model_validate(request["body"])
        return saved_out(plane().create(request["tenant"], definition)).model_dump(mode="json")

    return cast(Callable[..., dict[str, Any]], create)

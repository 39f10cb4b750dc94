"""Per-process wiring of the API: the control plane, the caller, idempotent create."""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Callable
from typing import Any, cast

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from api.views import saved_out
from punctual.control.plane import ControlPlane
from punctual.domain.errors import Forbidden
from punctual.domain.schedule import ScheduleDefinition
from punctual.services import Services, Wiring

IDEMPOTENCY_TTL_SECONDS = 24 * 3600
# Registered with each invocation's Lambda context (handler.py), so that a create cut off
# by the Lambda timeout frees its key when the invocation would have ended.
IDEMPOTENCY = IdempotencyConfig(
    event_key_jmespath="key",
    payload_validation_jmespath="body",
    expires_after_seconds=IDEMPOTENCY_TTL_SECONDS,
)

wiring = Wiring()
configure = wiring.configure  # tests and the local stack hand their services in


def services() -> Services:
    return wiring.services()


def plane() -> ControlPlane:
    return wiring.built(ControlPlane)


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


def create_once(request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create, remembered per (tenant, Idempotency-Key) for a day with a body fingerprint:
    the answer, and whether it is the one remembered (True) rather than made now. Each call
    marks what it would remember with a token of its own; an answer carrying another's was
    remembered from the first request."""
    token = uuid.uuid4().hex
    _CALL.set(token)
    answer = dict(wiring.built(_idempotent_create)(request=request))
    return {k: v for k, v in answer.items() if k != _MADE_BY}, answer.get(_MADE_BY) != token


_CALL: contextvars.ContextVar[str] = contextvars.ContextVar("create_once")
_MADE_BY = "made_by_call"


def _idempotent_create(services: Services) -> Callable[..., dict[str, Any]]:
    persistence = DynamoDBPersistenceLayer(
        table_name=services.settings.idempotency_table, boto3_client=services.dynamodb
    )

    @idempotent_function(
        data_keyword_argument="request", persistence_store=persistence, config=IDEMPOTENCY
    )
    def create(request: dict[str, Any]) -> dict[str, Any]:
        definition = ScheduleDefinition.model_validate(request["body"])
        made = saved_out(plane().create(request["tenant"], definition)).model_dump(mode="json")
        # (Not part of the request: its fingerprint, and so the key's meaning, is unchanged.)
        return {**made, _MADE_BY: _CALL.get()}

    return cast(Callable[..., dict[str, Any]], create)

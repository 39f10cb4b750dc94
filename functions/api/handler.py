"""API Lambda: API Gateway REST (IAM auth) -> the control plane."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from api.context import IDEMPOTENCY
from api.routes import router
from api.views import ErrorBody, ErrorOut
from punctual.errors import Conflict, InvalidInput, PunctualError
from punctual.models import field_errors
from punctual.observability import logger, tracer

app = APIGatewayRestResolver(enable_validation=True)
app.include_router(router)


def error_response(error: PunctualError) -> Response[Any]:
    details = {k: v for k, v in error.details.items() if k != "fields"}
    body = ErrorOut(
        error=ErrorBody(
            code=error.code,
            message=error.message,
            fields=error.details.get("fields", []),
            details=details,
        )
    )
    return Response(
        status_code=error.status,
        content_type=content_types.APPLICATION_JSON,
        body=body.model_dump_json(),
    )


@app.exception_handler(PunctualError)
def _domain_error(error: PunctualError) -> Response[Any]:
    if error.status >= 500:
        logger.exception("request failed")
    return error_response(error)


@app.exception_handler(RequestValidationError)
def _invalid_request(error: RequestValidationError) -> Response[Any]:
    fields = field_errors(error.errors())
    first = fields[0] if fields else {"field": "(request)", "reason": "invalid"}
    return error_response(InvalidInput(f"{first['field']}: {first['reason']}", fields))


@app.exception_handler(IdempotencyValidationError)
def _key_reused(_: IdempotencyValidationError) -> Response[Any]:
    return error_response(
        Conflict("this Idempotency-Key was used with a different body; use a new key")
    )


@app.exception_handler(IdempotencyAlreadyInProgressError)
def _key_in_progress(_: IdempotencyAlreadyInProgressError) -> Response[Any]:
    return error_response(Conflict("a request with this Idempotency-Key is still in progress"))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    IDEMPOTENCY.register_lambda_context(context)
    return app.resolve(event, context)

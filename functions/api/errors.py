"""Every answer that is not a success takes the one error shape:
``{"error": {"code", "message", "fields": [{"field", "reason"}], "details"}}``.

This holds for the domain's errors, request validation, the resolver's own answers (no
route: 404, a path without that method: 405, a body that is not JSON: 415) and anything
unexpected (500 with the request id, logged with its traceback).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)

from api.views import ErrorBody, ErrorOut
from punctual.domain.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PreconditionRequired,
    PunctualError,
    QuotaExceeded,
    RateExceeded,
    Retryable,
)
from punctual.domain.validation import field_errors
from punctual.observability import logger

# Request validation names a missing header by its lower-case name.
_IF_MATCH = ("header", "if-match")


class MethodNotAllowed(PunctualError):
    code = "method_not_allowed"
    callers_fault = True


class UnsupportedMediaType(PunctualError):
    code = "unsupported_media_type"
    callers_fault = True


# The one place a domain error becomes an HTTP status (a subclass takes its base's).
STATUS: dict[type[PunctualError], int] = {
    InvalidInput: 400,
    Forbidden: 403,
    NotFound: 404,
    MethodNotAllowed: 405,
    Conflict: 409,
    UnsupportedMediaType: 415,
    PreconditionRequired: 428,
    # A cap waiting does not lift: 409, which clients and SDKs do not retry (a 429 they
    # retry, in vain); a rate quota: 429 with Retry-After.
    QuotaExceeded: 409,
    RateExceeded: 429,
    Retryable: 503,
}


def status_of(error: PunctualError) -> int:
    return next((STATUS[c] for c in type(error).__mro__ if c in STATUS), 500)


def error_response(
    error: PunctualError, headers: dict[str, str] | None = None, request_id: str | None = None
) -> Response[Any]:
    """``request_id`` (API Gateway's, also the logs' correlation id) lets a 5xx be found."""
    details = {k: v for k, v in error.details.items() if k != "fields"}
    if request_id is not None:
        details["request_id"] = request_id
    body = ErrorOut(
        error=ErrorBody(
            code=error.code,
            message=error.message,
            fields=error.details.get("fields", []),
            details=details,
        )
    )
    if isinstance(error, RateExceeded):
        headers = {**(headers or {}), "Retry-After": str(error.retry_after)}
    return Response(
        status_code=status_of(error),
        content_type=content_types.APPLICATION_JSON,
        body=body.model_dump_json(),
        headers=headers,
    )


def install(app: APIGatewayRestResolver) -> None:
    """Register the handlers that give every failure of ``app`` the one error shape."""

    def request_id() -> str:
        return str(app.current_event.request_context.request_id)

    @app.exception_handler(PunctualError)
    def _domain_error(error: PunctualError) -> Response[Any]:
        if status_of(error) < 500:
            return error_response(error)
        logger.exception("request failed")
        return error_response(error, request_id=request_id())

    @app.exception_handler(RequestValidationError)
    def _invalid_request(error: RequestValidationError) -> Response[Any]:
        problems = error.errors()
        if any(p["type"] == "missing" and tuple(p["loc"]) == _IF_MATCH for p in problems):
            return error_response(
                PreconditionRequired("If-Match with the schedule's current version is required")
            )
        fields = field_errors(problems)
        first = fields[0] if fields else {"field": "(request)", "reason": "invalid"}
        return error_response(InvalidInput(f"{first['field']}: {first['reason']}", fields))

    @app.exception_handler(UnicodeDecodeError)
    def _not_text(_: UnicodeDecodeError) -> Response[Any]:
        # The body is the only thing the API decodes from bytes (API Gateway passes a body
        # that is not UTF-8 base64-encoded).
        reason = "the body is not UTF-8 text"
        return error_response(InvalidInput(reason, [{"field": "(body)", "reason": reason}]))

    @app.exception_handler(RequestUnsupportedContentType)
    def _not_json(_: RequestUnsupportedContentType) -> Response[Any]:
        return error_response(UnsupportedMediaType("send the body as application/json"))

    @app.exception_handler(NotFoundError)
    def _no_route(_: NotFoundError) -> Response[Any]:
        event = app.current_event
        # The resolver's route table (private, but the only place it is kept): a path that
        # exists with other methods answers 405 and names them.
        routes = app._static_routes + app._dynamic_routes
        allowed = sorted({r.method for r in routes if r.rule.match(event.path)})
        if allowed:
            return error_response(
                MethodNotAllowed(f"{event.http_method} is not allowed here", allowed=allowed),
                headers={"Allow": ", ".join(allowed)},
            )
        return error_response(NotFound(f"no such resource: {event.path}"))

    @app.exception_handler(IdempotencyValidationError)
    def _key_reused(_: IdempotencyValidationError) -> Response[Any]:
        return error_response(
            Conflict("this Idempotency-Key was used with a different body; use a new key")
        )

    @app.exception_handler(IdempotencyAlreadyInProgressError)
    def _key_in_progress(_: IdempotencyAlreadyInProgressError) -> Response[Any]:
        return error_response(Conflict("a request with this Idempotency-Key is still in progress"))

    @app.exception_handler(Exception)
    def _unexpected(_: Exception) -> Response[Any]:
        logger.exception("unexpected error")
        return error_response(
            PunctualError("an unexpected error; it was logged with this request id"),
            request_id=request_id(),
        )

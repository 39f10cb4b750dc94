"""Domain exceptions. The API maps each to one HTTP status and the one error shape."""

from __future__ import annotations

from typing import Any


class PunctualError(Exception):
    status = 500
    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(PunctualError):
    status = 400
    code = "invalid_input"

    def __init__(self, message: str, fields: list[dict[str, str]] | None = None) -> None:
        super().__init__(message, fields=fields or [])


class Forbidden(PunctualError):
    status = 403
    code = "forbidden"


class NotFound(PunctualError):
    status = 404
    code = "not_found"


class Conflict(PunctualError):
    """A conditional write lost: someone else changed the record first."""

    status = 409
    code = "conflict"


class PreconditionRequired(PunctualError):
    status = 428
    code = "precondition_required"


class QuotaExceeded(PunctualError):
    status = 429
    code = "quota_exceeded"

    def __init__(self, message: str, *, quota: str, limit: int, usage: int) -> None:
        super().__init__(message, quota=quota, limit=limit, usage=usage)


class Retryable(PunctualError):
    """Throttling or a transient service fault: the caller may retry."""

    status = 503
    code = "retry"

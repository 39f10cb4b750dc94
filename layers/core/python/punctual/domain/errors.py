"""Domain exceptions. They carry no HTTP status: the API maps each to one status and the
one error shape (functions/api/errors.py)."""

from __future__ import annotations

from typing import Any


class PunctualError(Exception):
    code = "internal_error"
    callers_fault = False  # the request itself is wrong or not allowed: repeating it won't help

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(PunctualError):
    code = "invalid_input"
    callers_fault = True

    def __init__(self, message: str, fields: list[dict[str, str]] | None = None) -> None:
        super().__init__(message, fields=fields or [])


class Forbidden(PunctualError):
    code = "forbidden"
    callers_fault = True


class NotFound(PunctualError):
    code = "not_found"
    callers_fault = True


class Conflict(PunctualError):
    """A change lost to another one: someone else changed the record first."""

    code = "conflict"
    callers_fault = True


class PreconditionRequired(PunctualError):
    code = "precondition_required"
    callers_fault = True


class QuotaExceeded(PunctualError):
    """Over a tenant's cap that waiting does not lift (the schedules a tenant may have, the
    strict fires of a minute of every hour)."""

    code = "quota_exceeded"
    callers_fault = True

    def __init__(self, message: str, *, quota: str, limit: int, usage: int, **details: Any) -> None:
        super().__init__(message, quota=quota, limit=limit, usage=usage, **details)


class RateExceeded(QuotaExceeded):
    """Over a rate quota (per minute): ``retry_after`` seconds until it lets the request
    through."""

    def __init__(
        self, message: str, *, quota: str, limit: int, usage: int, retry_after: int
    ) -> None:
        super().__init__(
            message, quota=quota, limit=limit, usage=usage, retry_after_seconds=retry_after
        )
        self.retry_after = retry_after


class Retryable(PunctualError):
    """Throttling or a transient service fault: the caller may retry."""

    code = "retry"

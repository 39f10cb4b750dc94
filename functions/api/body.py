"""Reading a request body: JSON only, and strictly.

Powertools' validation also parses form and multipart bodies (and fails on a multipart one
without a boundary with an unhandled error); this API takes JSON and answers 415 to
anything else.

Python's json module accepts more than JSON: NaN and Infinity, floats that overflow to
infinity (1e400), integers longer than Python converts (4,300 digits), unpaired surrogates
(which no store can encode), and nesting deep enough to exhaust the stack. Each of these
is refused here as a JSONDecodeError, which the resolver answers as a 400 (invalid JSON)
before any field is validated.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aws_lambda_powertools.event_handler.middlewares.openapi_validation import (
    OpenAPIRequestValidationMiddleware,
)
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType

# Deeper than any request needs (a payload nests at most MAX_PAYLOAD_DEPTH levels), far
# from the recursion limit of whatever walks the value next.
MAX_JSON_DEPTH = 64
_MAX_INT_DIGITS = 4300  # sys.get_int_max_str_digits(): Python's own default limit


class JsonBodiesOnly(OpenAPIRequestValidationMiddleware):
    """Request validation that reads a body only when it is JSON (or says no type)."""

    def _get_body(self, app: Any) -> dict[str, Any]:
        content_type = app.current_event.headers.get("content-type", "").strip().lower()
        if content_type and not content_type.startswith("application/json"):
            problem = {"type": "unsupported_content_type", "loc": ("body",), "msg": content_type}
            raise RequestUnsupportedContentType("Unsupported content type", errors=[problem])
        body: dict[str, Any] = super()._get_body(app)
        return body


def parse_body(text: str) -> Any:
    """The body's JSON value; JSONDecodeError for what this module refuses."""
    try:
        value = json.loads(
            text, parse_constant=_no_constant, parse_float=_finite, parse_int=_integer
        )
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _invalid(f"nested deeper than {MAX_JSON_DEPTH} levels", text) from None
    except ValueError as error:  # from the parse_* hooks below
        raise _invalid(str(error), text) from None
    _check_tree(value, text)
    return value


def _invalid(reason: str, text: str) -> json.JSONDecodeError:
    return json.JSONDecodeError(reason, text, 0)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits is too long")
    return int(text)


def _check_tree(value: Any, text: str) -> None:
    """Depth and encodable strings (keys too), walked without recursion."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise _invalid(f"nested deeper than {MAX_JSON_DEPTH} levels", text)
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                reason = "a string holds an unpaired surrogate (\\ud800-\\udfff)"
                raise _invalid(reason, text) from None

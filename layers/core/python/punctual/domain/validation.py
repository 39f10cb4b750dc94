"""Pydantic's validation errors as the API's field errors: one per field, in the request's
terms."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

_UNION_TAGS = frozenset({"cron", "rate", "at"})
# Where API Gateway request errors come from; the field path starts after it.
_REQUEST_PARTS = frozenset({"body", "query", "path", "header"})


_SCHEMA_STEP = re.compile(r"^[a-z-]+\[.*\]$")


def field_errors(errors: ValidationError | Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Pydantic errors as [{'field': 'spec.expression', 'reason': '...'}], one per problem."""
    items = errors.errors(include_url=False) if isinstance(errors, ValidationError) else errors
    result = []
    for item in items:
        if item.get("type") == "none_required":
            continue  # an optional field's null branch: its value was not null, said below
        # (A request validated field by field names the schema steps of a union in its
        # path: "retry.function-after[_base_below_max(), RetryPolicy]". Not fields: dropped.)
        loc = [part for part in item["loc"] if not _SCHEMA_STEP.match(str(part))]
        if loc and loc[0] in _REQUEST_PARTS:
            loc = loc[1:]
        reason = str(item["msg"]).removeprefix("Value error, ")
        if item.get("type") == "json_invalid":
            loc = []  # its location is a character position in the body, not a field
            reason = f"not valid JSON: {item.get('ctx', {}).get('error', 'unreadable')}"
        # A discriminated union puts its tag after the field ('spec', 'cron', ...): drop it.
        parts = [
            str(part)
            for i, part in enumerate(loc)
            if not (i > 0 and loc[i - 1] == "spec" and part in _UNION_TAGS)
        ]
        result.append({"field": ".".join(parts) or "(body)", "reason": reason})
    return result

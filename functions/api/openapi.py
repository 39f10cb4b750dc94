"""The OpenAPI document, generated from the routes. ``make openapi`` writes docs/openapi.json;
a test fails when the committed file is stale."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn

from api.handler import app
from punctual.settings import Settings

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def document() -> str:
    sigv4 = APIKey.model_validate(
        {
            "type": "apiKey",
            "name": "Authorization",
            "in": APIKeyIn.header,
            "description": "AWS Signature Version 4 (API Gateway IAM authorization)",
            "x-amazon-apigateway-authtype": "awsSigv4",
        }
    )
    raw = app.get_openapi_json_schema(
        title="Punctual",
        version=Settings().version,
        description=(
            "Multi-tenant job scheduler: schedules (cron with IANA zones, rate, one-shot) become "
            "occurrences delivered at least once to the tenant's SQS queues. Every call is "
            "signed with SigV4; the tenant is derived from the caller's IAM principal."
        ),
        security_schemes={"sigv4": sigv4},
        security=[{"sigv4": []}],
    )
    return json.dumps(_with_links(_without_422(json.loads(raw))), indent=2) + "\n"


def _without_422(doc: dict[str, Any]) -> dict[str, Any]:
    """Request validation errors answer 400 in the one error shape (handler.py), not
    Powertools' default 422: drop what the generator adds for it."""
    for operations in doc["paths"].values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = doc.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return doc


_SCHEDULE = {"schedule_id": "$response.body#/schedule/schedule_id"}
# If-Match as HTTP writes an entity tag, quoted ("3"): the header is a string, not a number.
_AT_ITS_VERSION = {**_SCHEDULE, "if-match": '"{$response.body#/schedule/version}"'}
_ON_THE_SCHEDULE = {
    "GetSchedule": ("get", "/v1/schedules/{schedule_id}", _SCHEDULE),
    "UpdateSchedule": ("patch", "/v1/schedules/{schedule_id}", _AT_ITS_VERSION),
    "PauseSchedule": ("post", "/v1/schedules/{schedule_id}/pause", _SCHEDULE),
    "ResumeSchedule": ("post", "/v1/schedules/{schedule_id}/resume", _SCHEDULE),
    "CancelSchedule": ("delete", "/v1/schedules/{schedule_id}", _SCHEDULE),
    # (No link to a first occurrence: most answers make none, and a GET has no
    # `materialized`; a link must resolve in every answer it is on.)
    "ListOccurrences": ("get", "/v1/schedules/{schedule_id}/occurrences", _SCHEDULE),
}
_TENANT = {"tenant_id": "$response.body#/tenant_id"}
_ON_THE_TENANT = {
    "GetTenant": ("get", "/v1/admin/tenants/{tenant_id}", _TENANT),
    "SetQuotas": ("put", "/v1/admin/tenants/{tenant_id}/quotas", _TENANT),
    "BindPrincipal": ("post", "/v1/admin/tenants/{tenant_id}/principals", _TENANT),
}
# Where each answer leads (OpenAPI links): from a created schedule to the operations on it,
# from a tenant to the operator's. Clients, and schemathesis's stateful tests, follow them.
_LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, dict[str, str]]]] = {
    ("post", "/v1/schedules", "201"): _ON_THE_SCHEDULE,
    ("get", "/v1/schedules/{schedule_id}", "200"): _ON_THE_SCHEDULE,
    ("patch", "/v1/schedules/{schedule_id}", "200"): _ON_THE_SCHEDULE,
    ("post", "/v1/schedules/{schedule_id}/pause", "200"): _ON_THE_SCHEDULE,
    ("post", "/v1/schedules/{schedule_id}/resume", "200"): _ON_THE_SCHEDULE,
    ("post", "/v1/admin/tenants", "201"): _ON_THE_TENANT,
}


def _with_links(doc: dict[str, Any]) -> dict[str, Any]:
    paths = doc["paths"]
    for (method, path, status), links in _LINKS.items():
        paths[path][method]["responses"][status]["links"] = {
            name: {"operationId": paths[to_path][to_method]["operationId"], "parameters": params}
            for name, (to_method, to_path, params) in links.items()
        }
    return doc


def main() -> None:
    DOCUMENT.write_text(document(), encoding="utf-8")
    print(f"wrote {DOCUMENT}", file=sys.stderr)


if __name__ == "__main__":
    main()

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
    return json.dumps(_without_422(json.loads(raw)), indent=2) + "\n"


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


def main() -> None:
    DOCUMENT.write_text(document(), encoding="utf-8")
    print(f"wrote {DOCUMENT}", file=sys.stderr)


if __name__ == "__main__":
    main()

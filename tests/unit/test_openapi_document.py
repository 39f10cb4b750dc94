"""docs/openapi.json is generated from the routes; a stale copy fails here."""

from __future__ import annotations

import json
import re
from typing import Any

from api.openapi import DOCUMENT, document


def test_openapi_document_committed_matches_the_code():
    # GIVEN the routes as they are; WHEN the document is generated
    generated = document()
    # THEN the committed file is identical (run `make openapi` after changing the API)
    assert DOCUMENT.read_text(encoding="utf-8") == generated


def test_openapi_document_every_operation_is_sigv4_and_documents_the_error_shape():
    # GIVEN the generated document
    doc = json.loads(document())
    # THEN every operation is under SigV4 and answers 4xx with the one error shape, never 422
    assert doc["security"] == [{"sigv4": []}]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (path, method)
            error = responses["400"]["content"]["application/json"]["schema"]["$ref"]
            assert error == "#/components/schemas/ErrorOut", (path, method)


def _operation(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    operation: dict[str, Any] = doc["paths"][path][method]
    return operation


def test_openapi_document_if_match_is_required_as_the_server_requires_it():
    # GIVEN the document; THEN PATCH declares If-Match required (the server answers 428
    # without it) with the entity-tag form it accepts, and lists 428
    patch = _operation(json.loads(document()), "patch", "/v1/schedules/{schedule_id}")
    [if_match] = [p for p in patch["parameters"] if p["name"] == "if-match"]
    assert (if_match["in"], if_match["required"]) == ("header", True)
    assert re.fullmatch(if_match["schema"]["pattern"], 'W/"3"')
    assert not re.fullmatch(if_match["schema"]["pattern"], "three")
    assert "If-Match is missing" in patch["responses"]["428"]["description"]


def test_openapi_document_describes_each_error_per_route():
    # GIVEN the document
    doc = json.loads(document())
    # THEN every operation lists 403, 500 and 503, and 415 exactly when it takes a body
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            listed = set(operation["responses"])
            assert {"400", "403", "500", "503"} <= listed, (path, method)
            assert ("415" in listed) == ("requestBody" in operation), (path, method)
    # AND the descriptions are the route's own: what a 409 or 404 means differs per route
    create = _operation(doc, "post", "/v1/schedules")["responses"]
    assert "Idempotency-Key" in create["409"]["description"]
    assert "max_schedules" in create["409"]["description"]
    cancel = _operation(doc, "delete", "/v1/schedules/{schedule_id}")["responses"]
    assert "CANCELED already is a 200" in cancel["409"]["description"]
    assert "No such schedule" in cancel["404"]["description"]
    quotas = _operation(doc, "put", "/v1/admin/tenants/{tenant_id}/quotas")["responses"]
    assert "not an operator" in quotas["403"]["description"]


def test_openapi_document_links_lead_from_a_created_schedule_to_its_operations():
    # GIVEN the document; THEN the created schedule's answer links to the operations on it,
    # each link naming an operation that exists, with the id (and version) taken from it
    doc = json.loads(document())
    operation_ids = {op["operationId"] for ops in doc["paths"].values() for op in ops.values()}
    links = _operation(doc, "post", "/v1/schedules")["responses"]["201"]["links"]
    assert {"GetSchedule", "UpdateSchedule", "PauseSchedule", "CancelSchedule"} <= set(links)
    assert all(link["operationId"] in operation_ids for link in links.values())
    assert links["UpdateSchedule"]["parameters"] == {
        "schedule_id": "$response.body#/schedule/schedule_id",
        "if-match": '"{$response.body#/schedule/version}"',
    }


def _pointed(doc: dict[str, Any], schema: dict[str, Any], pointer: str) -> dict[str, Any] | None:
    """The schema ``pointer`` (a JSON pointer into an answer) names in every answer that
    ``schema`` admits; None when some answer may lack it (an optional property, an item of
    a list that may be empty)."""
    for part in pointer.strip("/").split("/"):
        while "$ref" in schema:
            schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        if part not in schema.get("required", []):
            return None
        schema = schema["properties"][part]
    return schema


def test_openapi_document_every_link_resolves_in_every_answer_it_is_on():
    # GIVEN the document's links (schemathesis follows them, and so may any client)
    doc = json.loads(document())
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                for name, link in answer.get("links", {}).items():
                    for value in link["parameters"].values():
                        # THEN each value taken from the answer's body names a property
                        # every such answer has (no item of a list that may be empty)
                        for pointer in re.findall(r"\$response\.body#([/\w]+)", value):
                            found = _pointed(doc, schema, pointer)
                            assert found is not None, (method, path, status, name, pointer)

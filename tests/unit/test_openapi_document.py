"""docs/openapi.json is generated from the routes; a stale copy fails here."""

from __future__ import annotations

import json

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

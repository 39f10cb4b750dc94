"""DynamoDB's responses parsed without botocore's walk of every attribute value.

botocore turns each response into Python by walking the service model: for an item, every
attribute value is a structure of ten possible members, each looked up and dispatched on
its own. An item's attributes arrive in DynamoDB's JSON already as botocore hands them on
(``{"S": "..."}``, ``{"N": "12"}``, nested ``M`` and ``L``) except binaries, which it
decodes from base64. So this parser hands the values on as they came, binaries decoded, and
leaves every other part of a response (keys, consumed capacity, errors) to botocore: the
same result, for a fraction of the CPU (`make bench`; 2026-12-03: about half of a page
read's CPU went to the walk).
"""

from __future__ import annotations

from typing import Any

from botocore.parsers import JSONParser, ResponseParserFactory

ATTRIBUTE_VALUE = "AttributeValue"  # the shape of one value in DynamoDB's service model


class _ValuesAsSent(JSONParser):  # type: ignore[misc]  # (botocore has no types)
    # (In DynamoDB's responses an attribute value is only ever a map's value: an item, a
    # key. tests/unit/test_responses.py checks that against the service model.)
    def _handle_map(self, shape: Any, value: Any) -> Any:
        if shape.value.name == ATTRIBUTE_VALUE:  # an item, a key
            return {name: self._attribute(typed) for name, typed in value.items()}
        return super()._handle_map(shape, value)

    def _attribute(self, typed: dict[str, Any]) -> dict[str, Any]:
        if "M" in typed:
            return {"M": {name: self._attribute(v) for name, v in typed["M"].items()}}
        if "L" in typed:
            return {"L": [self._attribute(v) for v in typed["L"]]}
        if "B" in typed:
            return {"B": self._blob_parser(typed["B"])}
        if "BS" in typed:
            return {"BS": [self._blob_parser(b) for b in typed["BS"]]}
        return typed  # S, N, SS, NS, BOOL, NULL: as sent


class ValuesAsSent(ResponseParserFactory):  # type: ignore[misc]
    """botocore's parser factory, with ``_ValuesAsSent`` for the JSON protocol (DynamoDB's;
    any other JSON service has no AttributeValue shape and parses as before)."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "json":
            return _ValuesAsSent(**self._defaults)
        return super().create_parser(protocol_name)

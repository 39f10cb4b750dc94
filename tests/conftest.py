"""What every test shares: botocore's service models, parsed once per process, and moto's
plain DynamoDB values written as they are (below).

moto's ``mock_aws`` starts each test with no default boto3 session, so every client a test
makes would come from a new session that parses the service's JSON model again (about 0.1 s
a client, a third of an integration test's setup). The models are read-only data; one
loader serves every session. Nothing else changes: each test still gets new sessions,
clients and moto backends.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import botocore.loaders
import botocore.session
import pytest

botocore.session.create_loader = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)


# moto 5.2's response serializer looks every member of every DynamoDB AttributeValue up
# through six alias providers: about 0.2 ms an attribute, a fifth of the CPU of the tests
# that run on moto (py-spy, 2026-12-02). An AttributeValue moto holds is already the JSON
# DynamoDB answers ({"S": "x"}, {"M": {...}}), so one made only of strings, booleans, lists
# and maps is written as it is; anything else (binary, another moto) takes moto's own path.
# tests/unit/test_moto_fast_path.py checks that both give the same body.
def _plain_attribute(value: object) -> bool:
    if type(value) is not dict or len(value) != 1:
        return False
    ((kind, inner),) = value.items()
    plain = _PLAIN_MEMBERS.get(kind)
    return plain is not None and plain(inner)


def _text(inner: object) -> bool:
    return type(inner) is str


def _flag(inner: object) -> bool:
    return type(inner) is bool


def _texts(inner: object) -> bool:
    return type(inner) is list and all(type(v) is str for v in inner)


def _plain_list(inner: object) -> bool:
    return type(inner) is list and all(_plain_attribute(v) for v in inner)


def _plain_map(inner: object) -> bool:
    return type(inner) is dict and all(
        type(k) is str and _plain_attribute(v) for k, v in inner.items()
    )


# Whether an AttributeValue's member is plain, by the member's type (its one key).
_PLAIN_MEMBERS: dict[object, Callable[[object], bool]] = {
    "S": _text,
    "N": _text,
    "BOOL": _flag,
    "NULL": _flag,
    "SS": _texts,
    "NS": _texts,
    "L": _plain_list,
    "M": _plain_map,
}


def _install_moto_fast_path() -> None:
    import moto
    from moto.core.serialize import BaseJSONSerializer

    if moto.__version__ != "5.2.5":  # another moto: its own path, unpatched
        return
    original = BaseJSONSerializer._serialize_type_structure

    def serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and _plain_attribute(value):
            serialized[key] = value
            return
        original(self, serialized, value, shape, key)

    serialize_structure.moto_original = original  # type: ignore[attr-defined]
    BaseJSONSerializer._serialize_type_structure = serialize_structure  # type: ignore[method-assign]


_install_moto_fast_path()


@pytest.fixture
def host_zone() -> Iterator[Callable[[str], None]]:
    """Puts the process in a local time zone (as on a developer's machine or a host not set
    to UTC) until the test ends: what Punctual computes must not depend on it. Only TZ is
    put back (a patch of its own: the test's other patches stay the test's)."""
    with pytest.MonkeyPatch.context() as patch:

        def enter(name: str) -> None:
            patch.setenv("TZ", name)
            time.tzset()

        yield enter
    time.tzset()

"""Page tokens (punctual.dal.common.encode_token and decode_token): what a client copies from
one answer into the next request's query string."""

from __future__ import annotations

import base64
import json
import random
import re
import string
from collections.abc import Mapping

import pytest

from punctual.dal.common import decode_token, encode_token
from punctual.domain.errors import InvalidInput


def _key(rng: random.Random) -> dict[str, dict[str, str]]:
    text = "".join(rng.choices(string.ascii_letters + string.digits + "#_-é", k=rng.randint(1, 40)))
    return {
        "schedule_id": {"S": text},
        "sk": {"S": f"OCC#{rng.randint(0, 10**10)}"},
        "due": {"N": str(rng.randint(-(10**12), 10**12))},
    }


def test_a_page_token_is_url_safe_reads_back_and_does_not_depend_on_the_keys_order() -> None:
    rng = random.Random(11)
    for _ in range(500):
        key = _key(rng)
        token = encode_token(key)
        assert token is not None
        # URL-safe with no padding: pasted into a query string as it is
        assert re.fullmatch(r"[A-Za-z0-9_-]+", token), token
        assert decode_token(token, expect={}, keys=frozenset(key)) == key
        # DynamoDB may list a LastEvaluatedKey's attributes in any order: the same page
        # gets the same token (a client can tell it has seen a page)
        assert encode_token(dict(reversed(key.items()))) == token


def test_no_key_is_no_token() -> None:
    assert encode_token(None) is None
    assert encode_token({}) is None
    assert decode_token(None, expect={}, keys=frozenset()) is None
    assert decode_token("", expect={}, keys=frozenset()) is None


def _token(key: Mapping[str, object]) -> str:
    """A token as a client could forge it: any JSON, base64url without padding."""
    raw = json.dumps(key).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("value", [1.5, None, True, ["OCC#1"], {"S": "OCC#1"}])
def test_a_token_whose_key_holds_anything_but_text_or_a_whole_number_is_refused(
    value: object,
) -> None:
    # (DynamoDB would refuse such a start key with a ValidationException: a 500)
    with pytest.raises(InvalidInput):
        decode_token(
            _token({"schedule_id": "s", "n": value}),
            expect={},
            keys=frozenset({"schedule_id", "n"}),
        )


def test_a_token_at_either_end_of_the_querys_range_is_taken() -> None:
    # The range is the query's own (BETWEEN lo AND hi): a start key at either end is valid
    keys = frozenset({"schedule_id", "sk"})
    within = ("OCC#0000000100", "OCC#0000000200")
    for sk in within:
        key = {"schedule_id": "s", "sk": sk}
        assert decode_token(_token(key), expect={}, keys=keys, sk_within=within) == {
            "schedule_id": {"S": "s"},
            "sk": {"S": sk},
        }
    for sk in ("OCC#0000000099", "OCC#0000000201"):
        with pytest.raises(InvalidInput):
            decode_token(
                _token({"schedule_id": "s", "sk": sk}), expect={}, keys=keys, sk_within=within
            )

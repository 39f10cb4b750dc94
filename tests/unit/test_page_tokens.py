"""Page tokens (punctual.dal.common.encode_token and decode_token): what a client copies from
one answer into the next request's query string."""

from __future__ import annotations

import random
import re
import string

from punctual.dal.common import decode_token, encode_token


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

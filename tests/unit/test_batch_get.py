"""punctual.dal.common.batch_get: every key asked for, in requests DynamoDB takes, the
unprocessed ones asked again after a jittered back-off and a bounded number of times,
strongly consistent unless told otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.dal.common import UNPROCESSED, Dynamo, batch_get, to_dynamo
from punctual.domain.errors import Retryable
from tests.fakes import as_client


class Table:
    """A BatchGetItem that serves at most ``serve`` keys a call and leaves the rest
    unprocessed, as DynamoDB does under load. Past ``calls`` calls it fails the test: an
    unbounded loop of asks then fails instead of hanging."""

    def __init__(
        self, items: list[dict[str, Any]], serve: int = 100, calls: int | None = None
    ) -> None:
        self.items = {item["pk"]: item for item in items}
        self.serve = serve
        self.calls = calls
        self.requests: list[dict[str, Any]] = []

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        ((table, part),) = RequestItems.items()
        if self.calls is not None and len(self.requests) >= self.calls:
            raise AssertionError(f"asked {len(self.requests) + 1} times: more than {self.calls}")
        self.requests.append(part)
        assert len(part["Keys"]) <= 100  # DynamoDB refuses more
        served, left = part["Keys"][: self.serve], part["Keys"][self.serve :]
        found = [to_dynamo(self.items[k["pk"]["S"]]) for k in served if k["pk"]["S"] in self.items]
        answer: dict[str, Any] = {"Responses": {table: found} if found else {}}
        if left:
            answer["UnprocessedKeys"] = {table: {**part, "Keys": left}}
        return answer


def test_every_key_is_read_in_requests_of_100_at_most_and_in_the_order_asked() -> None:
    items = [{"pk": f"k{n:03d}", "n": n} for n in range(250)]
    table = Table(items)
    keys = [{"pk": f"k{n:03d}"} for n in reversed(range(251))]  # (k250 does not exist)
    found = batch_get(Dynamo(as_client(table)), "t", keys)
    assert [i["n"] for i in found] == list(reversed(range(250)))
    assert [len(r["Keys"]) for r in table.requests] == [100, 100, 51]
    assert all(r["ConsistentRead"] is True for r in table.requests)


def test_what_dynamodb_leaves_unprocessed_is_asked_again_after_a_jittered_pause() -> None:
    table = Table([{"pk": f"k{n}", "n": n} for n in range(5)], serve=2)
    slept: list[float] = []
    found = batch_get(
        Dynamo(as_client(table), slept.append),
        "t",
        [{"pk": f"k{n}"} for n in range(5)],
        consistent=False,
    )
    assert [i["n"] for i in found] == [0, 1, 2, 3, 4]
    assert [len(r["Keys"]) for r in table.requests] == [5, 3, 1]
    assert all(r["ConsistentRead"] is False for r in table.requests)
    # (throttled keys come back at once: asked again at once they would hammer the partition)
    assert len(slept) == 2
    assert all(0 <= pause <= UNPROCESSED.ceiling(n) for n, pause in enumerate(slept))


def test_keys_left_unprocessed_every_time_are_retryable_after_a_bounded_number_of_asks() -> None:
    # GIVEN a table that never serves anything (every key throttled, every time), and fails
    # the test past one ask more than the bound (an unbounded loop would ask forever)
    table = Table([{"pk": "k0", "n": 0}], serve=0, calls=UNPROCESSED.tries + 1)
    slept: list[float] = []
    # WHEN the keys are read; THEN it gives up after UNPROCESSED's tries, retryable (503)
    with pytest.raises(Retryable):
        batch_get(Dynamo(as_client(table), slept.append), "t", [{"pk": "k0"}])
    assert len(table.requests) == UNPROCESSED.tries
    assert len(slept) == UNPROCESSED.tries - 1


def test_no_item_found_is_an_empty_list() -> None:
    # (DynamoDB's answer then holds no entry for the table)
    assert batch_get(Dynamo(as_client(Table([]))), "t", [{"pk": "nothing"}]) == []

"""punctual.dal.common.batch_get: every key asked for, in requests DynamoDB takes, the
unprocessed ones asked again, strongly consistent unless told otherwise."""

from __future__ import annotations

from typing import Any

from punctual.dal.common import batch_get, to_dynamo


class Table:
    """A BatchGetItem that serves at most ``serve`` keys a call and leaves the rest
    unprocessed, as DynamoDB does under load."""

    def __init__(self, items: list[dict[str, Any]], serve: int = 100) -> None:
        self.items = {item["pk"]: item for item in items}
        self.serve = serve
        self.requests: list[dict[str, Any]] = []

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        ((table, part),) = RequestItems.items()
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
    found = batch_get(table, "t", keys)
    assert [i["n"] for i in found] == list(reversed(range(250)))
    assert [len(r["Keys"]) for r in table.requests] == [100, 100, 51]
    assert all(r["ConsistentRead"] is True for r in table.requests)


def test_what_dynamodb_leaves_unprocessed_is_asked_again() -> None:
    table = Table([{"pk": f"k{n}", "n": n} for n in range(5)], serve=2)
    found = batch_get(table, "t", [{"pk": f"k{n}"} for n in range(5)], consistent=False)
    assert [i["n"] for i in found] == [0, 1, 2, 3, 4]
    assert [len(r["Keys"]) for r in table.requests] == [5, 3, 1]
    assert all(r["ConsistentRead"] is False for r in table.requests)


def test_no_item_found_is_an_empty_list() -> None:
    # (DynamoDB's answer then holds no entry for the table)
    assert batch_get(Table([]), "t", [{"pk": "nothing"}]) == []

"""create_tables' wait for an index it rebuilds (punctual.dal.tables._wait_for_index): gone,
or ACTIVE, or a clear error when it never gets there."""

from __future__ import annotations

import time
from typing import Any

import pytest

from punctual.dal import tables


class Described:
    """A client whose describe_table answers the statuses given, one per call (the last
    one again and again); None: the table has no secondary index at all."""

    def __init__(self, *statuses: str | None) -> None:
        self.statuses = list(statuses)
        self.calls = 0

    def describe_table(self, TableName: str) -> dict[str, Any]:
        status = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        if status is None:
            return {"Table": {"TableName": TableName}}  # (DynamoDB leaves the key out)
        return {"Table": {"GlobalSecondaryIndexes": [{"IndexName": "ix", "IndexStatus": status}]}}


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda seconds: None)


def test_a_deleted_index_is_gone_when_the_table_lists_no_index_at_all() -> None:
    # (the table's last secondary index deleted: DescribeTable has no GlobalSecondaryIndexes)
    client = Described("DELETING", None)
    tables._wait_for_index(client, "t", "ix", present=False)
    assert client.calls == 2


def test_a_created_index_is_waited_for_until_active() -> None:
    client = Described("CREATING", "CREATING", "ACTIVE")
    tables._wait_for_index(client, "t", "ix", present=True)
    assert client.calls == 3


def test_an_index_that_never_gets_ready_is_a_timeout_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(range(0, 10**6, 30))
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    with pytest.raises(TimeoutError, match="index ix of t did not become ready"):
        tables._wait_for_index(Described("CREATING"), "t", "ix", present=True)

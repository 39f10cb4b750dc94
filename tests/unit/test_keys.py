"""The keys stored items are found by: the due index's bucket (punctual.dal.schedules.due_bucket)
and an occurrence's sort key (punctual.dal.tables.occurrence_sk). Both are in every stored
item: a change of form strands what was written before it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from punctual.dal.schedules import due_bucket
from punctual.dal.tables import occurrence_sk


@pytest.fixture
def far_from_utc(host_zone: Callable[[str], None]) -> None:
    """The process's local time zone, as on a developer's machine running `make run`."""
    host_zone("Pacific/Kiritimati")  # UTC+14: every local date differs


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


def test_due_bucket_is_the_utc_minute_and_the_shard_in_the_documented_form(far_from_utc: None):
    # GIVEN a process whose local time zone is far from UTC
    # THEN the bucket is still the UTC minute (the ticker, the API and the reconciler on
    # other machines name the same bucket), year first, the shard four digits wide
    assert due_bucket(_epoch("2026-11-30T09:15:42"), 7) == "202611300915#0007"
    assert due_bucket(_epoch("2026-12-31T23:59:59"), 1234) == "202612312359#1234"


def test_due_buckets_of_one_shard_sort_as_their_minutes():
    minutes = [_epoch(t) for t in ("2026-09-30T23:59:00", "2026-10-01T00:00:00", "2027-01-01")]
    buckets = [due_bucket(m, 3) for m in minutes]
    assert sorted(buckets) == buckets
    assert len(set(buckets)) == 3


def test_a_run_now_key_sorts_right_after_the_fire_of_its_instant_and_version():
    # (a schedule's occurrences list in the order they were due, a run now beside the fire
    # of its second)
    at = 1_800_000_000
    keys = [
        occurrence_sk(at - 1, 9),
        occurrence_sk(at, 1),
        occurrence_sk(at, 1, manual="run_1"),
        occurrence_sk(at, 2),
        occurrence_sk(at + 1, 1),
    ]
    assert sorted(keys) == keys

"""The sort-key range of a schedule's occurrences scheduled in [since, until]
(punctual.dal.occurrences._sk_range): what every listing, reconciliation and re-plan of a
schedule's occurrences reads."""

from __future__ import annotations

from punctual.dal.occurrences import _sk_range
from punctual.dal.tables import occurrence_sk

SINCE, UNTIL = 1_800_000_000, 1_800_003_600
# The versions a fixed-width sort key holds, from a new schedule's first to the largest.
VERSIONS = (1, 7, 99, 100, 123_456, 10**9, 10**10 - 1)


def _inside(sk: str, since: int = SINCE, until: int = UNTIL) -> bool:
    low, high = _sk_range(since, until)
    return low <= sk <= high


def test_the_range_holds_every_version_and_run_now_of_its_first_and_last_second() -> None:
    for version in VERSIONS:
        for instant in (SINCE, SINCE + 1, UNTIL - 1, UNTIL):
            assert _inside(occurrence_sk(instant, version)), (instant, version)
            if version < 10**10 - 1:  # (a run now's key sorts after its version's)
                assert _inside(occurrence_sk(instant, version, manual="run_1")), (instant, version)


def test_the_range_holds_nothing_of_the_seconds_around_it() -> None:
    for version in VERSIONS:
        assert not _inside(occurrence_sk(SINCE - 1, version))
        assert not _inside(occurrence_sk(SINCE - 1, version, manual="run_1"))
        assert not _inside(occurrence_sk(UNTIL + 1, version))


def test_a_range_from_before_the_epoch_starts_at_its_first_second() -> None:
    # (a backfill or a reconciliation window computed back from an early instant)
    assert _inside(occurrence_sk(0, 1), since=-3600, until=60)

"""The worker's measure of its clock's offset from SQS's (punctual.skew): every
first receive bounds it, the bounds intersect, the lower one is never above the true offset,
a stepped clock starts the estimate again, and old samples are dropped."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from punctual.skew import (
    KEEP_SECONDS,
    MAX_DRIFT,
    MAX_SAMPLES,
    RESOLUTION,
    ClockSkew,
    Offset,
)

T = 1_800_000_000.0


class Host:
    """A host whose clock (``wall``) moves with its monotonic one unless stepped; the
    ClockSkew under test sees its monotonic clock."""

    def __init__(self) -> None:
        self.steady = 0.0
        self.skew = ClockSkew(monotonic=lambda: self.steady)

    def observe(self, stamp: float, called: float, answered: float, *, step: float = 0.0) -> None:
        """A sample answered at ``answered`` by the wall clock; ``step``: how far the wall
        clock was stepped since the last one (the monotonic clock did not move by it)."""
        self.steady = answered - T - step
        self.skew.observe(stamp, called, answered)


def test_one_sample_bounds_the_offset_by_its_call() -> None:
    skew = Host().skew
    assert skew.offset(T) is None
    assert skew.true_now(T) == T  # no sample: the host's clock as it is
    # SQS stamped T + 2.1 (its clock) in a call made at T and answered at T + 0.3 (ours)
    skew.observe(T + 2.1, T, T + 0.3)
    found = skew.offset(T + 0.3)
    assert found is not None
    assert math.isclose(found.low, 1.8, abs_tol=1e-5)
    assert math.isclose(found.high, 2.1 + RESOLUTION, abs_tol=1e-5)
    assert found.samples == 1
    assert math.isclose(skew.true_now(T + 0.3), T + 2.1, abs_tol=1e-5)


def test_samples_intersect_and_the_tightest_call_decides() -> None:
    host = Host()
    host.observe(T + 10.5, T, T + 20)  # a long poll answered late: a loose bound
    host.observe(T + 30.0, T + 29.99, T + 30.01)  # answered at once: offset within 0.02
    found = host.skew.offset(T + 30.01)
    assert found is not None
    assert found.samples == 2
    assert math.isclose(found.low, -0.01, abs_tol=1e-5)
    assert math.isclose(found.high, 0.01 + RESOLUTION, abs_tol=1e-5)
    assert math.isclose(found.width, 0.02 + RESOLUTION, abs_tol=1e-5)
    # (and the bounds widen with the samples' age, by the drift a clock may have)
    later = host.skew.offset(T + 130.01)
    assert later is not None
    assert math.isclose(later.low, -0.01 - 100 * MAX_DRIFT, abs_tol=1e-5)


def test_a_stepped_clock_starts_the_estimate_again() -> None:
    host = Host()
    host.observe(T, T - 0.01, T + 0.01)  # offset about 0
    host.observe(T + 65, T + 59.99, T + 60.01)  # about +5 s: contradicts it
    found = host.skew.offset(T + 61)
    assert found is not None
    assert found.samples == 1
    assert 4.9 < found.low < 5.0


@pytest.mark.parametrize(
    ("stamp", "called", "step", "kept"),
    [
        # stepped 3 s ahead (true offset now -2.5 s), measured next by a long poll whose
        # loose upper bound still allows +0.5: the earlier sample is dropped, or the lower
        # bound would stay at +0.5 (the worker's idea of now 3 s ahead: handlers early)
        (57.5, 40.0, 3.0, 1),
        # moved 40 ms more than the monotonic clock in a minute: more than STEP_SECONDS
        # alone, within it plus a minute's drift: a slew, both samples kept
        (60.5, 59.995, 0.04, 2),
    ],
    ids=["step", "slew"],
)
def test_a_step_of_the_host_clock_drops_the_earlier_samples_and_a_slew_does_not(
    stamp: float, called: float, step: float, kept: int
) -> None:
    # GIVEN an offset of +0.5 s well measured, then a sample a minute later
    host = Host()
    host.observe(T + 0.5, T - 0.005, T + 0.005)
    host.observe(T + stamp, T + called, T + 60.005, step=step)
    found = host.skew.offset(T + 60.005)
    assert found is not None
    assert found.samples == kept
    assert found.low <= stamp - 60.005 + 1e-6


def test_a_drifting_clock_never_leaves_the_lower_bound_above_the_offset() -> None:
    # GIVEN a host clock slewed fast at 500 ppm, measured every 10 s by tight calls
    host = Host()
    offset = 0.0
    for n in range(60):
        wall = T + 10 * n
        offset = -MAX_DRIFT * 10 * n  # SQS's time minus ours shrinks as ours runs fast
        host.observe(wall + offset, wall - 0.002, wall + 0.002)
        # THEN at every moment the lower bound is at most the true offset
        found = host.skew.offset(wall + 0.002)
        assert found is not None
        assert found.low <= offset + 1e-6


def test_samples_older_than_kept_are_dropped() -> None:
    skew = Host().skew
    skew.observe(T + 1, T, T + 0.01)
    assert skew.offset(T + KEEP_SECONDS - 1) is not None
    assert skew.offset(T + KEEP_SECONDS + 1) is None


def test_a_sample_that_cannot_be_is_ignored() -> None:
    skew = Host().skew
    skew.observe(math.nan, T, T + 1)
    skew.observe(T, T + 2, T + 1)  # answered before it was called
    skew.observe(T, -math.inf, T + 1)  # a call whose start is not known
    assert skew.offset(T) is None


@given(
    offset=st.floats(-30, 30),
    calls=st.lists(
        st.tuples(st.floats(0, 3000), st.floats(0, 20), st.floats(0, 1)), min_size=1, max_size=30
    ),
)
def test_the_estimate_always_holds_the_true_offset(
    offset: float, calls: list[tuple[float, float, float]]
) -> None:
    # GIVEN receive calls made at ``start`` (our clock), each lasting ``length``, SQS
    # stamping within it at the fraction ``at`` (its clock = ours + offset), in ms
    host = Host()
    latest = 0.0
    for start, length, at in sorted(calls):
        called = T + start
        answered = called + length
        stamp = math.floor((called + at * length + offset) * 1000) / 1000
        host.observe(stamp, called, answered)
        latest = max(latest, answered)
    skew = host.skew
    found = skew.offset(latest)
    # THEN the true offset is within the bounds (and so the true time is never before
    # true_now: the worker never starts early by it)
    assert isinstance(found, Offset)
    assert found.low <= offset + 1e-6
    assert offset <= found.high + 1e-6
    assert skew.true_now(latest) <= latest + offset + 1e-6


def test_the_samples_kept_are_bounded_in_number_and_by_age_to_the_second() -> None:
    host = Host()
    for n in range(MAX_SAMPLES + 44):
        host.observe(T + n + 1, T + n - 0.5, T + n)
    found = host.skew.offset(T + MAX_SAMPLES + 43)
    assert found is not None
    assert found.samples == MAX_SAMPLES
    # (a sample exactly KEEP_SECONDS old is still kept)
    alone = Host()
    alone.observe(T + 1, T - 1, T)
    assert alone.skew.offset(T + KEEP_SECONDS) is not None


def test_a_sample_whose_bounds_only_touch_the_others_is_kept_with_them() -> None:
    # GIVEN a sample whose lower bound is exactly another's upper bound (both answered at
    # once: no drift between them)
    host = Host()
    host.observe(T + 2.001, T, T + 1)  # offset within [1.001, 2.001 + RESOLUTION]
    first = host.skew.offset(T + 1)
    assert first is not None
    touching = T + 1 + first.high  # its lower bound: exactly the first one's upper bound
    host.observe(touching, T + 0.5, T + 1)
    # THEN it agrees with it (one offset satisfies both): both kept, not a restart
    found = host.skew.offset(T + 1)
    assert found is not None
    assert found.samples == 2
    assert found.low == found.high == first.high

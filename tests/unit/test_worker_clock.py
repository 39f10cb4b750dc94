"""The worker's measure of its clock's offset from SQS's (punctual_client.worker.clock): every
first receive bounds it, the bounds intersect, the lower one is never above the true offset,
a stepped clock starts the estimate again, and old samples are dropped."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from punctual_client.worker.clock import KEEP_SECONDS, RESOLUTION, ClockSkew, Offset

T = 1_800_000_000.0


def test_one_sample_bounds_the_offset_by_its_call() -> None:
    skew = ClockSkew()
    assert skew.offset(T) is None
    assert skew.true_now(T) == T  # no sample: the host's clock as it is
    # SQS stamped T + 2.1 (its clock) in a call made at T and answered at T + 0.3 (ours)
    skew.observe(T + 2.1, T, T + 0.3)
    found = skew.offset(T + 1)
    assert found is not None
    assert math.isclose(found.low, 1.8, abs_tol=1e-5)
    assert math.isclose(found.high, 2.1 + RESOLUTION, abs_tol=1e-5)
    assert found.samples == 1
    assert math.isclose(skew.true_now(T + 1), T + 2.8, abs_tol=1e-5)


def test_samples_intersect_and_the_tightest_call_decides() -> None:
    skew = ClockSkew()
    skew.observe(T + 10.5, T, T + 20)  # a long poll answered late: a loose bound
    skew.observe(T + 30.0, T + 29.99, T + 30.01)  # answered at once: offset within 0.02
    found = skew.offset(T + 31)
    assert found is not None
    assert math.isclose(found.low, -0.01, abs_tol=1e-5)
    assert math.isclose(found.high, 0.01 + RESOLUTION, abs_tol=1e-5)
    assert math.isclose(found.width, 0.02 + RESOLUTION, abs_tol=1e-5)


def test_a_stepped_clock_starts_the_estimate_again() -> None:
    skew = ClockSkew()
    skew.observe(T, T - 0.01, T + 0.01)  # offset about 0
    skew.observe(T + 65, T + 59.99, T + 60.01)  # about +5 s: contradicts it
    found = skew.offset(T + 61)
    assert found is not None
    assert found.samples == 1
    assert 4.9 < found.low < 5.0


def test_samples_older_than_kept_are_dropped() -> None:
    skew = ClockSkew()
    skew.observe(T + 1, T, T + 0.01)
    assert skew.offset(T + KEEP_SECONDS - 1) is not None
    assert skew.offset(T + KEEP_SECONDS + 1) is None


def test_a_sample_that_cannot_be_is_ignored() -> None:
    skew = ClockSkew()
    skew.observe(math.nan, T, T + 1)
    skew.observe(T, T + 2, T + 1)  # answered before it was called
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
    skew = ClockSkew()
    latest = 0.0
    for start, length, at in sorted(calls):
        called = T + start
        answered = called + length
        stamp = math.floor((called + at * length + offset) * 1000) / 1000
        skew.observe(stamp, called, answered)
        latest = max(latest, answered)
    found = skew.offset(latest)
    # THEN the true offset is within the bounds (and so the true time is never before
    # true_now: the worker never starts early by it)
    assert isinstance(found, Offset)
    assert found.low <= offset + 1e-6
    assert offset <= found.high + 1e-6
    assert skew.true_now(latest) <= latest + offset + 1e-6

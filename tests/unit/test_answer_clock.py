"""A server component's clock against DynamoDB's (punctual.skew.AnswerClock): each
answer's Date bounds the offset, at most one answer a second is taken, what is published is
the offset nearest zero the bounds allow, and every DynamoDB call the stores make is timed."""

from __future__ import annotations

import math
import time
from email.utils import formatdate
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from punctual.dal.common import Dynamo, dynamo
from punctual.observability import add_clock_skew, metrics
from punctual.services import Services
from punctual.settings import Settings
from punctual.skew import AnswerClock, ClockSkew, Offset, answer_date

T = 1_800_000_000.0


def dated(server_time: float, **answer: Any) -> dict[str, Any]:
    """An answer as botocore hands it over, with the Date a server at ``server_time`` sends
    (whole seconds, truncated)."""
    headers = {"date": formatdate(server_time, usegmt=True)}
    return answer | {"ResponseMetadata": {"HTTPHeaders": headers}}


class Calls:
    """Our clock, and a call that takes ``length`` seconds of it, answered by a server whose
    clock is ours plus ``offset``, stamping at ``at`` of the call's length."""

    def __init__(self, offset: float) -> None:
        self.now = T
        self.offset = offset
        self.steady = 0.0
        self.clock = AnswerClock(lambda: self.now, ClockSkew(monotonic=lambda: self.steady))

    def call(self, length: float = 0.2, at: float = 0.5, *, answer: Any = None) -> Any:
        def made() -> Any:
            stamped = self.now + at * length + self.offset
            self.now += length
            self.steady += length
            return dated(stamped) if answer is None else answer

        return self.clock.timed(made)

    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.steady += seconds


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Tue, 08 Dec 2026 00:48:55 GMT", 1796690935.0),
        # (a Date without a zone is read as UTC, whatever the host's zone)
        ("Tue, 08 Dec 2026 00:48:55 -0000", 1796690935.0),
        ("Tue, 08 Dec 2026 01:48:55 +0100", 1796690935.0),
        ("yesterday", None),
        ("", None),
    ],
)
def test_an_answers_date_is_read_as_epoch_seconds(
    header: str, expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (on a host whose local zone is not UTC)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        answer = {"ResponseMetadata": {"HTTPHeaders": {"date": header}}}
        assert answer_date(answer) == expected
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    "answer",
    [
        None,
        [],
        {},
        {"ResponseMetadata": None},
        {"ResponseMetadata": {"HTTPHeaders": []}},
        {"ResponseMetadata": {"HTTPHeaders": {"date": 5}}},
    ],
)
def test_an_answer_without_a_date_has_none(answer: Any) -> None:
    assert answer_date(answer) is None


def test_one_answer_bounds_the_offset_by_its_call_and_the_dates_second() -> None:
    # GIVEN our clock 3 s behind DynamoDB's, a call from T + 0.2 to T + 0.4 (ours), stamped
    # at T + 3.3 by the server: its Date says T + 3
    calls = Calls(offset=3.0)
    calls.wait(0.2)
    calls.call(length=0.2, at=0.5)
    # THEN the offset is at least T + 3 - (T + 0.4), at most T + 4 - (T + 0.2)
    found = calls.clock.offset()
    assert found is not None
    assert math.isclose(found.low, 2.6, abs_tol=1e-6)
    assert math.isclose(found.high, 3.8, abs_tol=1e-6)
    # AND what is published is how far off the clock is for certain: 2.6 s behind
    assert math.isclose(found.least, 2.6, abs_tol=1e-6)


def test_at_most_one_answer_a_second_is_taken() -> None:
    calls = Calls(offset=0.0)
    calls.call(length=0.25)
    calls.call(length=0.5)
    calls.call(length=0.4375)  # answered 0.9375 s after the first answer
    assert (found := calls.clock.offset()) is not None
    assert found.samples == 1
    calls.call(length=0.0625)  # 1 s after it
    assert (found := calls.clock.offset()) is not None
    assert found.samples == 2


def test_a_clock_stepped_back_is_seen_at_once_not_when_it_catches_up() -> None:
    # GIVEN a clock in step with DynamoDB's, measured for 10 s
    calls = Calls(offset=0.0)
    for _ in range(10):
        calls.call(length=0.01)
        calls.wait(1.0)
    assert (before := calls.clock.offset()) is not None
    assert before.least == 0
    # WHEN it is stepped back 600 s (the monotonic clock does not move by it)
    calls.now -= 600
    calls.offset += 600
    # THEN the samples taken before it no longer say it is in step
    assert calls.clock.offset() is None
    # AND the next answer, a second later by the monotonic clock, measures the step
    calls.wait(1.0)
    calls.call(length=0.01)
    found = calls.clock.offset()
    assert found is not None
    assert found.samples == 1
    assert found.least > 599


def test_an_answer_without_a_date_is_no_sample_and_keeps_the_next_one() -> None:
    calls = Calls(offset=0.0)
    assert calls.call(answer={"Items": []}) == {"Items": []}  # the answer itself, untouched
    assert calls.clock.offset() is None
    calls.call()  # at once after: taken (the undated answer was no sample)
    assert calls.clock.offset() is not None


@pytest.mark.parametrize(
    ("low", "high", "least"),
    [(-0.4, 0.6, 0.0), (0.0, 0.6, 0.0), (-0.6, 0.0, 0.0), (1.5, 2.5, 1.5), (-2.5, -1.5, -1.5)],
)
def test_what_is_published_is_the_offset_nearest_zero_the_bounds_allow(
    low: float, high: float, least: float
) -> None:
    assert Offset(low, high, 1).least == least


@given(
    offset=st.floats(-30, 30),
    calls=st.lists(
        st.tuples(st.floats(0, 5), st.floats(0, 2), st.floats(0, 1)), min_size=1, max_size=30
    ),
)
def test_the_bounds_always_hold_the_true_offset_and_the_published_one_is_never_more(
    offset: float, calls: list[tuple[float, float, float]]
) -> None:
    # GIVEN calls at any pace, of any length, stamped anywhere within them by a server
    # whose clock is ours plus ``offset`` (Dates truncated to the second)
    made = Calls(offset)
    for pause, length, at in calls:
        made.wait(pause)
        made.call(length, at)
    found = made.clock.offset()
    # THEN the true offset is within the bounds, and the published one is on its side of
    # zero and no farther from it
    assert found is not None
    assert found.low <= offset + 1e-6 <= found.high + 2e-6
    assert found.least * offset >= 0
    assert abs(found.least) <= abs(offset) + 1e-6


def test_many_answers_narrow_the_bounds_below_the_dates_second() -> None:
    # GIVEN our clock 0.3 s behind, and quick calls at every tenth of a second's phase
    calls = Calls(offset=0.3)
    for _ in range(40):
        calls.call(length=0.01, at=0.5)
        calls.wait(1.09)
    found = calls.clock.offset()
    # THEN the bounds hold 0.3 within about a tenth of a second (each Date that just
    # turned bounds it from one side)
    assert found is not None
    assert found.low <= 0.3 <= found.high
    assert found.width < 0.15
    assert found.least > 0.15


class Raw:
    """A DynamoDB client whose every answer is dated ``offset`` seconds after ``now()``."""

    def __init__(self, now: Any, offset: float) -> None:
        self.now, self.offset, self.calls = now, offset, 0

    def _answer(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        return dated(self.now() + self.offset)

    get_item = batch_get_item = query = scan = put_item = update_item = _answer
    transact_write_items = _answer

    def get_paginator(self, _: str) -> Any:
        raw = self

        class Pages:
            def paginate(self, **_: Any) -> Any:
                return iter([raw._answer(), raw._answer()])

        return Pages()


@pytest.mark.parametrize(
    "call",
    [
        lambda db: db.get_item(),
        lambda db: db.batch_get_item(),
        lambda db: db.query(),
        lambda db: db.scan(),
        lambda db: db.put_item(),
        lambda db: db.update_item(),
        lambda db: db.transact_write_items(),
        lambda db: list(db.query_pages()),
    ],
)
def test_every_call_the_stores_make_is_timed(call: Any) -> None:
    # GIVEN the stores' client with a clock 2 s ahead of DynamoDB's
    clock = [T]
    answers = AnswerClock(lambda: clock[0])
    db = Dynamo(Raw(lambda: clock[0] - 2, 0.0), clock=answers)  # type: ignore[arg-type]
    # WHEN it makes the call
    call(db)
    # THEN its answer bounded the offset
    found = answers.offset()
    assert found is not None
    assert found.low <= -2 <= found.high
    assert found.least < 0


def test_another_sleep_keeps_the_clock_and_none_times_nothing() -> None:
    answers = AnswerClock(lambda: T)
    db = Dynamo(Raw(lambda: T, 0.0), clock=answers)  # type: ignore[arg-type]
    assert dynamo(db, lambda _: None).clock is answers
    untimed = Dynamo(Raw(lambda: T, 0.0))  # type: ignore[arg-type]
    untimed.get_item()
    assert untimed.clock is None


def test_services_time_their_stores_calls_on_their_own_clock() -> None:
    # GIVEN services whose clock is 5 s behind DynamoDB's
    clock = [T]
    services = Services(
        Raw(lambda: clock[0] + 5, 0.0), None, Settings(), lambda: clock[0], sleep=lambda _: None
    )
    assert services.clock_offset() is None
    # WHEN a store reads
    services.schedules.current("sch_nothing")
    # THEN the offset is known, on the services' clock
    found = services.clock_offset()
    assert found is not None
    assert found.low <= 5 <= found.high
    assert found.least > 4


def test_the_skew_is_published_as_how_far_off_for_certain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not add_clock_skew("relay", None)
    assert add_clock_skew("relay", Offset(-2.5, -1.5, 3))
    published: dict[str, Any] = dict(metrics.serialize_metric_set())
    metrics.clear_metrics()
    assert published["ClockSkew"] in (1.5, [1.5])
    (warning,) = [r for r in caplog.records if r.getMessage() == "clock off DynamoDB's"]
    assert (warning.component, warning.ahead_by_at_least) == ("relay", 1.5)  # type: ignore[attr-defined]
    caplog.clear()
    assert add_clock_skew("api", Offset(0.25, 4.0, 1))
    metrics.clear_metrics()
    (warning,) = caplog.records
    assert (warning.component, warning.behind_by_at_least) == ("api", 0.25)  # type: ignore[attr-defined]
    caplog.clear()
    # (a clock within the bounds of zero: 0 published, nothing logged)
    assert add_clock_skew("relay", Offset(-0.5, 0.5, 3))
    assert dict(metrics.serialize_metric_set())["ClockSkew"] in (0, [0])
    metrics.clear_metrics()
    assert not caplog.records


def test_a_sample_recorded_late_is_no_step() -> None:
    # GIVEN a second sample whose thread waited 0.2 s before recording it (the lock held
    # by another), while both clocks moved on
    calls = Calls(offset=0.0)
    recorded = 0

    class Waiting(ClockSkew):
        def observe(self, *args: Any, **kwargs: Any) -> None:
            nonlocal recorded
            recorded += 1
            if recorded == 2:
                calls.wait(0.2)
            super().observe(*args, **kwargs)

    calls.clock = AnswerClock(lambda: calls.now, Waiting(monotonic=lambda: calls.steady))
    calls.call(length=0.01)
    calls.wait(1.0)
    calls.call(length=0.01)
    # THEN it is kept with the first: the monotonic clock was read next to its answer
    found = calls.clock.offset()
    assert found is not None
    assert found.samples == 2


def test_a_sample_up_to_a_second_ahead_of_the_time_asked_is_no_step_back() -> None:
    skew = ClockSkew(monotonic=lambda: 0.0)
    skew.observe(T + 1, T + 0.5, T + 1)
    # (asked about a moment a second before its answer: another thread's read of the clock)
    assert skew.offset(T) is not None
    # (more than a second before: the clock was stepped back since)
    assert skew.offset(T - 0.5) is None

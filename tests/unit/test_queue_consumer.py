"""The worker SDK's long-polling loop while SQS cannot be reached: growing pauses, capped,
and one log line when polls start failing (or fail another way) and one when they work
again; a delivery whose processing fails is kept, saying why."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from punctual.skew import ClockSkew
from punctual_client.worker import QueueConsumer, Worker
from punctual_client.worker.core import Outcome
from tests.log_lines import plain_lines

QUEUE = "http://127.0.0.1:9324/000000000000/punctual-demo_default"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The shared logger as `punctual worker` sets it (plain lines), into a buffer."""
    with plain_lines("WARNING") as sink:
        yield sink


class Stop(threading.Event):
    """A stop event whose waits take no time: it records each pause asked for, and is set
    once ``polls`` polls were made."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.pauses.append(timeout)
        return self.is_set()


class Sqs:
    """An SQS client whose receive_message follows a script: an exception to raise, or an
    answer; the stop event is set when the script ends."""

    def __init__(self, script: list[Exception | dict[str, Any]], stop: Stop) -> None:
        self.script = script
        self.stop = stop

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        step = self.script.pop(0)
        if not self.script:
            self.stop.set()
        if isinstance(step, Exception):
            raise step
        return step


def consumer(script: list[Exception | dict[str, Any]], stop: Stop) -> QueueConsumer:
    # Only its services' SQS client and clock, and its clock skew, are used by a poll that
    # receives nothing.
    services = SimpleNamespace(sqs=Sqs(script, stop), now=lambda: 0.0)
    worker = cast(Worker, SimpleNamespace(services=services, skew=ClockSkew()))
    return QueueConsumer(worker, QUEUE, wait_seconds=1)


def refused() -> EndpointConnectionError:
    return EndpointConnectionError(endpoint_url="http://127.0.0.1:9324/")


def test_consumer_backs_off_while_sqs_is_down_and_logs_each_change_once(lines: io.StringIO):
    # GIVEN SQS unreachable for ten polls, then answering (nothing to receive) twice
    stop = Stop()
    script: list[Exception | dict[str, Any]] = [refused() for _ in range(10)]
    script += [{"Messages": []}, {"Messages": []}]
    # WHEN the consumer runs until the script ends
    consumer(script, stop).run(stop)
    # THEN the pause after each failure doubles from 1 s up to 30 s, at least half of
    # each ceiling (equal jitter), and none after the polls that worked
    ceilings = [1, 2, 4, 8, 16, 30, 30, 30, 30, 30]
    assert len(stop.pauses) == len(ceilings)
    for pause, ceiling in zip(stop.pauses, ceilings, strict=True):
        assert ceiling / 2 <= pause <= ceiling
    # AND the log says once that polls fail (and why), and once that they work again
    said = lines.getvalue().splitlines()
    assert len(said) == 2, said
    assert f"ERROR polling {QUEUE} failed; polling again after growing pauses" in said[0]
    assert said[0].endswith(
        'EndpointConnectionError: Could not connect to the endpoint URL: "http://127.0.0.1:9324/"'
    )
    assert f"WARNING polling {QUEUE} works again, after 10 failed polls over " in said[1]


def test_consumer_logs_again_when_the_failure_changes_and_starts_over_after_recovery(
    lines: io.StringIO,
):
    # GIVEN SQS unreachable, then refusing the credentials, then answering, then unreachable
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "ReceiveMessage")
    stop = Stop()
    script: list[Exception | dict[str, Any]] = [refused(), refused(), denied, denied]
    script += [{"Messages": []}, refused(), {"Messages": []}]
    # WHEN the consumer runs
    consumer(script, stop).run(stop)
    # THEN one line per change: failing, failing another way, working, failing, working
    said = [line.split(" ", 2)[1] for line in lines.getvalue().splitlines()]
    assert said == ["ERROR", "ERROR", "WARNING", "ERROR", "WARNING"]
    assert "AccessDenied" in lines.getvalue().splitlines()[1]
    # AND the pauses grow over the whole outage, whatever its kind, and start over after it
    ceilings = [1, 2, 4, 8, 1]
    for pause, ceiling in zip(stop.pauses, ceilings, strict=True):
        assert ceiling / 2 <= pause <= ceiling


def test_consumer_tells_failures_apart_by_their_code_and_times_the_outage_from_its_first(
    lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a clock that moves only by the consumer's own pauses, and SQS throttling twice,
    # then denying twice (the same class of error, another code), then answering
    stop = Stop()
    monkeypatch.setattr(
        "punctual_client.worker.consume.time.monotonic", lambda: 1000 + sum(stop.pauses)
    )

    def error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "no"}}, "ReceiveMessage")

    script: list[Exception | dict[str, Any]] = [error("ThrottlingException")] * 2
    script += [error("AccessDenied")] * 2 + [{"Messages": []}]
    # WHEN the consumer runs
    consumer(script, stop).run(stop)
    # THEN each code is logged once, named, and the recovery counts the whole outage: from
    # the first failure to the answer, every pause in it
    said = lines.getvalue().splitlines()
    assert [line.split(" ", 2)[1] for line in said] == ["ERROR", "ERROR", "WARNING"]
    assert "ThrottlingException" in said[0]
    assert "AccessDenied" in said[1]
    assert (
        said[2]
        .split(" ", 2)[2]
        .startswith(
            f"polling {QUEUE} works again, after 4 failed polls over {sum(stop.pauses):.0f} s"
        )
    )


def test_consumer_tells_other_failures_apart_by_their_class_and_survives_an_odd_one(
    lines: io.StringIO,
):
    # GIVEN SQS refusing connections, then timing out, then a ClientError with no error part
    # at all (not what botocore makes, but nothing to crash the loop on), then answering
    stop = Stop()
    timeout = ReadTimeoutError(endpoint_url="http://127.0.0.1:9324/")
    odd = ClientError({}, "ReceiveMessage")
    script: list[Exception | dict[str, Any]] = [refused(), timeout, odd, {"Messages": []}]
    # WHEN the consumer runs
    consumer(script, stop).run(stop)
    # THEN each change of kind is logged, and the loop goes on to the answer
    said = [line.split(" ", 2)[1] for line in lines.getvalue().splitlines()]
    assert said == ["ERROR", "ERROR", "ERROR", "WARNING"]


def test_consumer_keeps_a_message_whose_processing_failed_saying_why():
    # GIVEN a worker whose processing of a delivery fails past its own retries
    def fail(delivery: Any) -> None:
        raise RuntimeError("DynamoDB unreachable")

    worker = cast(Worker, SimpleNamespace(process=fail))
    # WHEN the consumer processes it
    result = QueueConsumer(worker, QUEUE)._process(cast(Any, None))
    # THEN the message is kept (it comes back), and the result names the error
    assert (result.outcome, result.detail) == (Outcome.FAILED, "RuntimeError: DynamoDB unreachable")
    assert not result.delete
    # (and a consumer takes four deliveries at once unless told otherwise: docs/worker.md)
    assert QueueConsumer(worker, QUEUE).threads == 4


def test_consumer_measures_its_clock_from_first_receives_and_logs_when_the_estimate_moves():
    # GIVEN a consumer whose host clock is SQS's minus about 2.5 s (its monotonic clock
    # moving with it: no step)
    steady = [0.0]
    skew = ClockSkew(monotonic=lambda: steady[0])
    worker = cast(Worker, SimpleNamespace(services=SimpleNamespace(now=lambda: 0.0), skew=skew))
    polling = QueueConsumer(worker, QUEUE)

    def received(stamp_ms: int, called: float, answered: float, count: str = "1") -> None:
        steady[0] = answered
        attributes = {
            "ApproximateFirstReceiveTimestamp": str(stamp_ms),
            "ApproximateReceiveCount": count,
        }
        polling._measure_skew([{"Attributes": attributes}], called, answered)

    with plain_lines("INFO") as sink:

        def logged() -> int:
            return sink.getvalue().count("clock offset from SQS measured")

        # WHEN a message comes without attributes (SQS sends none unless asked): no sample
        polling._measure_skew([{"Body": "{}"}], 100.0, 100.2)
        assert skew.offset(100.2) is None
        assert logged() == 0
        # WHEN a first receive is stamped 102.6 in a call from 100.0 to 100.2: measured
        # (within [2.4, 2.601]) and logged
        received(102_600, 100.0, 100.2)
        assert logged() == 1
        # WHEN the next one moves the estimate 50 ms: not logged again
        received(103_650, 101.0, 101.2)
        assert (found := skew.offset(101.2)) is not None
        assert found.low == pytest.approx(2.45)
        assert logged() == 1
        # WHEN one moves it 150 ms from what was logged: logged again
        received(104_250, 101.6, 101.7)
        assert (found := skew.offset(101.7)) is not None
        assert found.low == pytest.approx(2.55)
        assert logged() == 2

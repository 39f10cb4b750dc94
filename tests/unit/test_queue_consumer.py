"""The worker SDK's long-polling loop while SQS cannot be reached: growing pauses, capped,
and one log line when polls start failing and one when they work again."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from punctual_client.worker import QueueConsumer, Worker
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
    # Only its services' SQS client is used by a poll that receives nothing.
    worker = cast(Worker, SimpleNamespace(services=SimpleNamespace(sqs=Sqs(script, stop))))
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

"""Plain log lines for the local processes: each thread's Lambda context stays its own."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from punctual.observability import logger
from punctual_local.gateway import LambdaContext
from tests.log_lines import plain_lines


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The shared logger switched to plain lines into a buffer; put back afterwards."""
    with plain_lines("INFO") as sink:
        yield sink


def test_plain_logs_keep_each_threads_lambda_context_its_own(lines: io.StringIO):
    # GIVEN two Lambdas invoked at once in two threads of one process (as `local up` runs
    # them), each decorated as on AWS and appending its tenant
    both_started = threading.Barrier(2)

    @logger.inject_lambda_context
    def handler(event: dict[str, Any], context: Any) -> None:
        logger.append_keys(tenant_id=event["tenant"])
        both_started.wait(timeout=10)  # both contexts are set before either logs
        logger.warning("not delivered; will be retried", extra={"error": event["error"]})

    calls = [("relay", "acme", "throttled"), ("api", "globex", "conflict")]
    threads = [
        threading.Thread(
            target=handler,
            args=({"tenant": tenant, "error": error}, LambdaContext(name, 60, time.time)),
        )
        for name, tenant, error in calls
    ]
    # WHEN both log
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    # THEN each line is one plain line with its own function, tenant and extra, none other
    found = sorted(line.split(" ", 1)[1] for line in lines.getvalue().splitlines())
    assert found == [
        "WARNING api: not delivered; will be retried (tenant_id=globex, error=conflict)",
        "WARNING relay: not delivered; will be retried (tenant_id=acme, error=throttled)",
    ]


def test_plain_logs_print_an_exception_in_one_line(lines: io.StringIO):
    # GIVEN a failure logged with its exception, as the drivers do
    try:
        raise ConnectionError("the engine went away")
    except ConnectionError:
        logger.exception("poll failed; polling again")
    # THEN one line names it, without the traceback (that comes at DEBUG)
    [line] = lines.getvalue().splitlines()
    assert line.endswith("ERROR poll failed; polling again: ConnectionError: the engine went away")

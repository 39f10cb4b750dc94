"""The shared logger switched to plain lines (as `punctual worker` and `local up` set it)
into a buffer, and put back afterwards: for tests that read what a person would see."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from punctual.observability import logger
from punctual_client.logs import plain_logs


@contextlib.contextmanager
def plain_lines(level: str) -> Iterator[io.StringIO]:
    handler = logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    formatter, stream, previous = handler.formatter, handler.stream, logger.log_level
    # Assigned, not setStream (which flushes the stream it replaces): the one before may be
    # an earlier pytest session's capture, closed since (mutmut runs pytest again and again
    # in one process), and flushing it would fail the test before it starts.
    handler.stream = io.StringIO()
    plain_logs(level)
    sink = io.StringIO()
    handler.setStream(sink)
    try:
        yield sink
    finally:
        handler.setFormatter(formatter)
        handler.stream = stream
        logger.setLevel(previous)

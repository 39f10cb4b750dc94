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
    plain_logs(level)
    sink = io.StringIO()
    handler.setStream(sink)
    try:
        yield sink
    finally:
        handler.setFormatter(formatter)
        handler.setStream(stream)
        logger.setLevel(previous)

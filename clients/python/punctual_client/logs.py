"""Logs for people: the processes started from a terminal (`punctual local up`, `punctual
worker`) print one plain line per record on stderr, where a Lambda prints JSON for
CloudWatch; their stdout stays for what they print on purpose.

Locally every Lambda runs in a thread of one process, and Powertools' appended keys
(``inject_lambda_context``'s function name, the API's tenant) belong to the whole
logger: one thread's record would carry another thread's function and tenant. Here the
keys belong to the thread that appended them."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from aws_lambda_powertools.logging.formatter import BasePowertoolsFormatter

from punctual.observability import logger

_STANDARD = {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime"}
# Shown after the message when a thread has them; the rest of the Lambda context is noise.
SHOWN_KEYS = ("tenant_id", "schedule_id", "occurrence_id")


class PlainFormatter(BasePowertoolsFormatter):
    """``HH:MM:SS LEVEL function: message (key=value, ...)``, the exception in one line
    (the whole traceback at DEBUG)."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def _keys(self) -> dict[str, Any]:
        keys: dict[str, Any] | None = getattr(self._local, "keys", None)
        if keys is None:
            keys = self._local.keys = {}
        return keys

    def append_keys(self, **additional_keys: Any) -> None:
        self._keys().update(additional_keys)

    def get_current_keys(self) -> dict[str, Any]:
        return dict(self._keys())

    def remove_keys(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._keys().pop(key, None)

    def clear_state(self) -> None:
        self._keys().clear()

    thread_safe_append_keys = append_keys
    thread_safe_get_current_keys = get_current_keys
    thread_safe_remove_keys = remove_keys
    thread_safe_clear_keys = clear_state

    def format(self, record: logging.LogRecord) -> str:
        keys = self._keys()
        where = keys.get("function_name")
        context = {k: keys[k] for k in SHOWN_KEYS if keys.get(k) is not None}
        context |= {k: v for k, v in vars(record).items() if k not in _STANDARD}
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname} "
        line += f"{where}: " if where else ""
        line += record.getMessage()
        if context:
            line += " (" + ", ".join(f"{k}={v}" for k, v in context.items()) + ")"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            if logger.log_level <= logging.DEBUG:
                line += "\n" + self.formatException(record.exc_info)
            else:
                line += f": {type(error).__name__}: {error}"
        return line


def plain_logs(level: str) -> None:
    """Switch the shared logger to plain lines on stderr at ``level``."""
    handler = logger.registered_handler
    handler.setFormatter(PlainFormatter())
    if isinstance(handler, logging.StreamHandler):
        handler.setStream(sys.stderr)
    logger.setLevel(level)

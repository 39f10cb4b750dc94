"""The local SQS engine: moto's server in a process of its own, with one narrow fix.

moto 5.2.5 builds every queue attribute, including three counts that scan all of the
queue's messages, whenever it reads a single one: ``send_message`` reads
ContentBasedDeduplication and ``receive_message`` reads MessageRetentionPeriod per
message. A queue holding thousands of delayed messages (which pre-staging creates)
then slows sends from about 100 to 15 per second. The fix makes ``Queue.attributes``
a lazy mapping: the same keys and values, each computed only when read. It is pinned
to the moto version and source it was written against (tests/unit/test_local_sqs.py
fails when moto changes that code). Run: ``python -m punctual.local.sqs --port N``.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import logging
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

MOTO_VERSION = "5.2.5"
# sha256 of moto.sqs.models.Queue.attributes' source, the code the fix replaces.
ATTRIBUTES_SOURCE_SHA256 = "40cb990b121628d535cecbcd0e0d333984024633b70a097489ae8611e1a59338"


def attributes_source_digest() -> str:
    from moto.sqs.models import Queue

    source = inspect.getsource(Queue.attributes.fget)  # type: ignore[attr-defined]
    return hashlib.sha256(source.encode()).hexdigest()


class LazyAttributes(Mapping[str, Any]):
    """moto's Queue.attributes, computed per key instead of all at once."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue

    def _names(self) -> list[str]:
        queue = self._queue
        names = list(queue.BASE_ATTRIBUTES)
        if queue.fifo_queue:
            names += queue.FIFO_ATTRIBUTES
        if queue.kms_master_key_id:
            names += queue.KMS_ATTRIBUTES
        return names

    def __getitem__(self, name: str) -> Any:
        from moto.core.utils import camelcase_to_underscores

        if name not in self._names():
            raise KeyError(name)
        queue = self._queue
        if name == "RedrivePolicy" and queue.redrive_policy:
            value: Any = json.dumps(queue.redrive_policy)
        else:
            value = getattr(queue, camelcase_to_underscores(name))
        return str(value).lower() if isinstance(value, bool) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


def install_lazy_attributes() -> None:
    import moto
    from moto.sqs.models import Queue

    if moto.__version__ != MOTO_VERSION:
        raise RuntimeError(
            f"the SQS attribute fix is written for moto {MOTO_VERSION}, not {moto.__version__}"
        )
    if attributes_source_digest() != ATTRIBUTES_SOURCE_SHA256:
        raise RuntimeError("moto's Queue.attributes changed: review the SQS attribute fix")
    Queue.attributes = property(LazyAttributes)  # type: ignore[assignment,method-assign]


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Run moto's SQS server in the foreground until SIGTERM or SIGINT."""
    install_lazy_attributes()
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m punctual.local.sqs")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(args.port)


if __name__ == "__main__":
    main()

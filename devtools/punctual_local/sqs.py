"""The local SQS engine: roto (PyPI ``roto-aws``, a Rust binary with no Python code, MIT).

It keeps queues, their attributes and policies, and every message (visible, in flight or
delayed) in SQLite under its data folder, so a restart, Ctrl-C or a kill -9 of the
engine loses nothing SQS would have kept. ``--durable`` also fsyncs every call, as SQS
survives a machine's crash too. Two differences from SQS that callers meet: a missing
queue answers the query-protocol code ``AWS.SimpleQueueService.NonExistentQueue`` (botocore
does not map it to ``QueueDoesNotExist``; ``queue_exists`` accepts both), and
ListDeadLetterSourceQueues is not implemented (Punctual does not call it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import IO, Any

from botocore.exceptions import ClientError

from punctual_local.dynamodb import EngineMissing

ROTO_VERSION = "0.10.1"  # pinned in pyproject.toml's `local` extra; the engine record says it
MISSING_QUEUE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


def roto_binary() -> Path:
    """``roto-server`` from this interpreter's environment (where pip put it), else PATH."""
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / "roto-server").is_file():
            return folder / "roto-server"
    found = shutil.which("roto-server")
    if found is None:
        raise EngineMissing("the SQS engine roto-server is not installed; run `make install`")
    return Path(found)


def sqs_command(port: int, data_dir: Path | None, account: str) -> list[str]:
    """The engine's command line: on loopback, our account id, and never its default data
    folder (``./roto-data`` in the working directory)."""
    storage = ["--ephemeral"] if data_dir is None else ["--data-dir", str(data_dir), "--durable"]
    command = [str(roto_binary()), "--host", "127.0.0.1", "--port", str(port)]
    return [*command, "--account-id", account, *storage]


def launch_sqs(
    port: int, data_dir: Path | None, account: str, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start the engine in a session of its own, so that it outlives the caller (the local
    stack reattaches to it) and a Ctrl-C in the terminal does not reach it."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        sqs_command(port, data_dir, account),
        stdout=log,
        stderr=log,
        cwd=data_dir or tempfile.gettempdir(),  # whatever it writes, never into the repo
        start_new_session=True,
    )


def queue_exists(sqs: Any, queue_url: str) -> bool:
    try:
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in MISSING_QUEUE:
            return False
        raise
    return True

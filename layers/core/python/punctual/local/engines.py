"""The local engines, each a process of its own: DynamoDB Local (Java, data persisted in
the data folder) and moto's SQS server. Their ports and pids are kept in
``<data>/engines.json``, so a Punctual process that dies (even by kill -9) is replaced by
one that reattaches to the engines still running, or restarts them on the same ports
and the persisted tables; queue URLs stored in the tables stay valid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from punctual.local.dynamodb import (
    EngineMissing,
    free_port,
    launch_dynamodb,
    listening,
    wait_listening,
)

REGION = "us-east-1"
LOCAL_SHARDS = 8  # fixed: schedules are placed on shards by id modulo this
ACCOUNT = "000000000000"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@dataclass
class Engine:
    name: str
    port: int
    pid: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return _alive(self.pid)

    def running(self) -> bool:
        return self.alive() and listening(self.port)

    def stop(self) -> None:
        if not _alive(self.pid):
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.1)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)  # reap it if it is our child
        if _alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)


@dataclass
class Engines:
    dynamodb: Engine
    sqs: Engine
    reattached: bool

    def environment(self) -> dict[str, str]:
        """What boto3 needs to talk to these engines (AWS_ENDPOINT_URL_* is standard)."""
        return {
            "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb.endpoint,
            "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": self.dynamodb.endpoint,
            "AWS_ENDPOINT_URL_SQS": self.sqs.endpoint,
            "AWS_DEFAULT_REGION": REGION,
            # DynamoDB Local's streams are not reachable through account-based endpoints.
            "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
        }

    def stop(self) -> None:
        self.sqs.stop()
        self.dynamodb.stop()


def _state_file(data: Path) -> Path:
    return data / "engines.json"


def _read_state(data: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(_state_file(data).read_text()))
    except (OSError, ValueError):
        return {}


def recorded(data: Path) -> list[Engine]:
    """The engines ``data``'s state file names, running or not (what a clean-up must stop)."""
    return [Engine(**entry) for entry in _read_state(data).values()]


def _start_sqs(port: int, data: Path) -> Engine:
    log = (data / "sqs.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "punctual.local.sqs", "--port", str(port)],
        stdout=log,
        stderr=log,
        start_new_session=True,  # not killed with the terminal's process group
    )
    wait_listening(port, process, 30)
    return Engine("sqs", port, process.pid)


def _start_dynamodb(port: int, data: Path, in_memory: bool = False) -> Engine:
    folder = data / "dynamodb"
    folder.mkdir(parents=True, exist_ok=True)
    process = launch_dynamodb(port, None if in_memory else folder, detached=True)
    wait_listening(port, process, 60)
    return Engine("dynamodb", port, process.pid)


def ensure_engines(
    data: Path,
    *,
    dynamodb_port: int | None = None,
    sqs_port: int | None = None,
    in_memory: bool = False,
) -> Engines:
    """Reattach to running engines, or start them (on their previous ports if known).
    ``in_memory``: DynamoDB Local keeps nothing on disk (benchmarks; several times faster)."""
    data.mkdir(parents=True, exist_ok=True)
    state = _read_state(data)
    found: dict[str, Engine] = {}
    reattached = True

    def dynamodb(port: int, folder: Path) -> Engine:
        try:
            return _start_dynamodb(port, folder, in_memory)
        except EngineMissing as missing:
            # moto's server (the SQS engine's process) serves DynamoDB and its streams too:
            # slow with volume (it scans and copies tables) and nothing survives a restart.
            print(
                f"WARNING: {missing}. DynamoDB falls back to moto, in memory: slow with "
                "volume and not persisted. Install Java 17+ and run `make tools`.",
                file=sys.stderr,
                flush=True,
            )
            return Engine("dynamodb", found["sqs"].port, found["sqs"].pid)

    starters: tuple[tuple[str, Callable[[int, Path], Engine], int | None], ...] = (
        ("sqs", _start_sqs, sqs_port),
        ("dynamodb", dynamodb, dynamodb_port),
    )
    for name, starter, wanted in starters:
        known = state.get(name)
        engine = Engine(**known) if known else None
        if engine is not None and (wanted is None or wanted == engine.port) and engine.running():
            found[name] = engine
            continue
        reattached = False
        port = wanted or (engine.port if engine and not listening(engine.port) else free_port())
        found[name] = starter(port, data)
    _state_file(data).write_text(
        json.dumps({name: asdict(engine) for name, engine in found.items()}, indent=2)
    )
    return Engines(dynamodb=found["dynamodb"], sqs=found["sqs"], reattached=reattached)


def running_environment(data: Path) -> dict[str, str] | None:
    """The environment for the engines recorded in ``data``, if they are running."""
    state = _read_state(data)
    if not {"dynamodb", "sqs"} <= set(state):
        return None
    engines = Engines(Engine(**state["dynamodb"]), Engine(**state["sqs"]), reattached=True)
    if not (engines.dynamodb.running() and engines.sqs.running()):
        return None
    return {**engines.environment(), "PUNCTUAL_SHARD_COUNT": str(LOCAL_SHARDS)}

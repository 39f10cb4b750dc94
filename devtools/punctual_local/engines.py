"""The local engines, each a process of its own that keeps its data in the data folder:
DynamoDB Local (Java; tables and streams in ``<data>/dynamodb``) and roto's SQS (queues
and messages in ``<data>/sqs``). Their ports, pids and kinds are kept in
``<data>/engines.json``, so a Punctual process that dies (even by kill -9) is replaced by
one that reattaches to the engines still running; an engine that died is started again
on its port and its data, by ``ensure_engines`` or, while a stack runs, by ``revive``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from punctual_local.dynamodb import free_port, launch_dynamodb, listening, wait_listening
from punctual_local.sqs import ROTO_VERSION, launch_sqs

REGION = "us-east-1"
LOCAL_SHARDS = 8  # fixed: schedules are placed on shards by id modulo this
ACCOUNT = "000000000000"

# What each engine runs. A record of another kind (an older Punctual's in-memory moto
# server, another roto release) is stopped and replaced on the same data.
KINDS = {"dynamodb": "dynamodb-local", "sqs": f"roto-aws {ROTO_VERSION}"}
# Text in an engine's command line: a recorded pid that a reboot gave to another program
# is never taken for an engine, nor stopped.
MARKERS = {"dynamodb-local": "DynamoDBLocal", KINDS["sqs"]: "roto-server"}
OLD_SQS_MARKER = "punctual.local.sqs"  # the moto server of Punctual before 2026-12-01


def _command_line(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        pass
    try:  # no /proc (macOS)
        found = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return found.stdout if found.returncode == 0 else ""


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to reap
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our child, dead (a zombie until now)
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
    kind: str = ""  # empty in records written before engines had kinds

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """Its process exists and is this engine (not a program that reused the pid)."""
        if not _alive(self.pid):
            return False
        marker = MARKERS.get(self.kind, OLD_SQS_MARKER if self.name == "sqs" else "DynamoDB")
        command = _command_line(self.pid)
        return command is None or marker in command

    def running(self) -> bool:
        return self.alive() and listening(self.port)

    def stop(self) -> None:
        if not self.alive():
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.05)
        if _alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)


def _state_file(data: Path) -> Path:
    return data / "engines.json"


def recorded(data: Path) -> dict[str, Engine]:
    """The engines ``data``'s state file names, running or not (what a clean-up must stop)."""
    try:
        state = json.loads(_state_file(data).read_text())
    except (OSError, ValueError):
        return {}
    return {name: Engine(**entry) for name, entry in dict(state).items()}


def _record(data: Path, engines: dict[str, Engine]) -> None:
    """Written whole or not at all: a torn file would make the next start launch a second
    engine on the same data."""
    state = _state_file(data)
    partial = state.with_suffix(".tmp")
    partial.write_text(json.dumps({name: asdict(e) for name, e in engines.items()}, indent=2))
    partial.replace(state)


def _start_sqs(port: int, data: Path, in_memory: bool) -> Engine:
    with (data / "sqs.log").open("ab") as log:
        process = launch_sqs(port, None if in_memory else data / "sqs", ACCOUNT, log)
    wait_listening(port, process, 30)
    return Engine("sqs", port, process.pid, KINDS["sqs"])


def _start_dynamodb(port: int, data: Path, in_memory: bool) -> Engine:
    folder = data / "dynamodb"
    folder.mkdir(parents=True, exist_ok=True)
    process = launch_dynamodb(port, None if in_memory else folder, detached=True)
    wait_listening(port, process, 60)
    return Engine("dynamodb", port, process.pid, KINDS["dynamodb"])


STARTERS: dict[str, Callable[[int, Path, bool], Engine]] = {
    "sqs": _start_sqs,
    "dynamodb": _start_dynamodb,
}


@dataclass
class Engines:
    data: Path
    in_memory: bool
    engines: dict[str, Engine]
    reattached: bool = True

    @property
    def dynamodb(self) -> Engine:
        return self.engines["dynamodb"]

    @property
    def sqs(self) -> Engine:
        return self.engines["sqs"]

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

    def _start(self, name: str, port: int) -> Engine:
        engine = STARTERS[name](port, self.data, self.in_memory)
        self.engines[name] = engine
        _record(self.data, self.engines)
        return engine

    def revive(self) -> list[Engine]:
        """Start again, on their ports and data, the engines whose process died. Never on
        another port: this process's clients were made for these endpoints (a port that
        another program took meanwhile is tried again on the next call)."""
        return [
            self._start(name, engine.port)
            for name, engine in list(self.engines.items())
            if not engine.alive() and not listening(engine.port)
        ]

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()


def ensure_engines(data: Path, *, in_memory: bool = False) -> Engines:
    """Reattach to the running engines ``data`` records, or start them (on their previous
    ports if free). ``in_memory``: nothing on disk (benchmarks; several times faster)."""
    data.mkdir(parents=True, exist_ok=True)
    found = Engines(data, in_memory, recorded(data))
    try:
        for name, kind in KINDS.items():
            engine = found.engines.get(name)
            if engine is not None and engine.kind == kind and engine.running():
                continue
            found.reattached = False
            if engine is not None:
                engine.stop()  # another kind, or alive without answering
            # The previous port if free: SQS queue URLs name it (boto3 sends to the endpoint
            # whatever host a URL names, so another port works too).
            port = engine.port if engine and not listening(engine.port) else free_port()
            found._start(name, port)
    except BaseException:
        found.stop()  # none left running without a stack (their data is on disk)
        raise
    return found


def running_environment(data: Path) -> dict[str, str] | None:
    """The environment for the engines recorded in ``data``, if they are running."""
    engines = recorded(data)
    if set(engines) != set(KINDS) or not all(e.running() for e in engines.values()):
        return None
    environment = Engines(data, False, engines).environment()
    return {**environment, "PUNCTUAL_SHARD_COUNT": str(LOCAL_SHARDS)}

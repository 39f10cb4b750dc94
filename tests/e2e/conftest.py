"""One local stack (`punctual local up`) for the whole session, driven as a user drives it:
the CLI in subprocesses, the API over HTTP, the engines through their AWS endpoints.

The stack runs with a 2 s tick and a 30 s lookahead so that occurrences flow within
seconds. Nothing outlives the session: teardown sends SIGINT (what Ctrl-C does), then
kills any engine that engines.json still names, even when a test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from punctual.services import Services
from punctual.settings import Settings
from punctual_client.http import ApiError, Client
from punctual_client.worker import Job, QueueConsumer, Worker
from punctual_local.dynamodb import free_port
from punctual_local.engines import LOCAL_SHARDS, REGION, recorded

REPO = Path(__file__).resolve().parents[2]
TICK_SECONDS = 2
LOOKAHEAD_SECONDS = 30
START_SECONDS = 120  # DynamoDB Local is a JVM: slow to start on a busy machine
STOP_SECONDS = 30
CLI_SECONDS = 60
SECRET = "e2e-secret"  # signatures are not verified locally; any secret will do


def local_principal(key: str) -> str:
    return f"arn:aws:iam::000000000000:user/{key}"


def wait_for(check: Callable[[], Any], seconds: float, what: str, every: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}; last: {found!r}")
        time.sleep(every)


def eventually(check: Callable[[], Any], seconds: float, every: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy or ``seconds`` pass; its last answer
    (for a THEN that should fail as an assertion)."""
    deadline = time.monotonic() + seconds
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return found


def punctual(*args: str) -> list[str]:
    """The command line of `punctual ARGS` with this interpreter (the repo's .venv)."""
    return [sys.executable, "-m", "punctual_client.cli", *args]


def _hermetic_environment() -> dict[str, str]:
    """The caller's environment without anything that would point AWS SDKs elsewhere."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "PUNCTUAL_", "POWERTOOLS_"))
    }


@dataclass(frozen=True)
class Run:
    """One finished CLI invocation."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert (self.code, self.err) == (0, ""), f"exit {self.code}: {self.err}"
        return json.loads(self.out)


def run_punctual(*args: str, env: dict[str, str] | None = None) -> Run:
    """`punctual ARGS` to its end (the hermetic environment unless ``env``)."""
    done = subprocess.run(
        punctual(*args),
        capture_output=True,
        text=True,
        env=_hermetic_environment() if env is None else env,
        cwd=REPO,
        timeout=CLI_SECONDS,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


@dataclass
class WorkerProcess:
    """`punctual worker` running in a subprocess; its output goes to a file."""

    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self) -> tuple[int | None, float]:
        """Ctrl-C: its exit code and how long it took to exit (None: not within 10 s)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return self.process.poll(), time.monotonic() - started


@dataclass
class Stack:
    url: str
    data: Path
    process: subprocess.Popen[bytes]
    log: Path
    exports: dict[str, str] = field(default_factory=dict)
    # After stop(): the exit code of `local up` and the engine pids it left running.
    stopped: tuple[int | None, list[int]] | None = None

    # --- the CLI, as a user runs it ------------------------------------------------------

    def environment(self, key: str) -> dict[str, str]:
        """What `eval "$(punctual local env)"` plus credentials for ``key`` give a shell."""
        return (
            _hermetic_environment()
            | self.exports
            | {
                "AWS_ACCESS_KEY_ID": key,
                "AWS_SECRET_ACCESS_KEY": SECRET,
            }
        )

    def cli(self, *args: str, key: str = "demo") -> Run:
        return run_punctual(*args, "--endpoint", self.url, env=self.environment(key))

    def cli_json(self, *args: str, key: str = "demo") -> Any:
        return self.cli(*args, "--json", key=key).json()

    @contextlib.contextmanager
    def cli_worker(self, target: str, key: str = "demo") -> Iterator[WorkerProcess]:
        log = self.data / f"worker-{target}-{time.monotonic_ns()}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                punctual("worker", "--target", target, "--endpoint", self.url),
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.environment(key) | {"PYTHONUNBUFFERED": "1"},
                cwd=REPO,
            )
        worker = WorkerProcess(process, log)
        try:
            yield worker
        finally:
            if process.poll() is None and worker.interrupt()[0] is None:
                process.kill()
                process.wait()

    # --- HTTP and the engines ------------------------------------------------------------

    def client(self, key: str = "demo") -> Client:
        return Client(self.url, access_key_id=key)

    def aws(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.exports[f"AWS_ENDPOINT_URL_{service.upper()}"],
            region_name=REGION,
            aws_access_key_id="demo",
            aws_secret_access_key=SECRET,
        )

    def services(self) -> Services:
        # model_construct: the stack's defaults (table names), not this shell's PUNCTUAL_*.
        settings = Settings.model_construct(shard_count=LOCAL_SHARDS)
        return Services(self.aws("dynamodb"), self.aws("sqs"), settings, time.time)

    def consumer(self, queue_url: str, handled: list[str], threads: int = 2) -> QueueConsumer:
        """An in-process worker of tenant demo whose handler records each occurrence id."""

        def record(job: Job) -> None:
            handled.append(job.occurrence_id)

        worker = Worker(self.services(), "demo", record)
        return QueueConsumer(worker, queue_url, wait_seconds=1, threads=threads)

    def watermarks(self) -> list[int]:
        """Each shard's materializer watermark: the first minute bucket it has not walked."""
        table = self.services().settings.leases_table
        items = self.aws("dynamodb").scan(TableName=table, ConsistentRead=True)["Items"]
        return [int(item["watermark"]["N"]) for item in items if "watermark" in item]

    def engine_pids(self) -> list[int]:
        return [engine.pid for engine in recorded(self.data).values()]


class StackFailed(Exception):
    """`local up` exited or did not answer in time."""


def answering(stack: Stack) -> bool:
    try:
        stack.client().get("/v1/meta")
    except (OSError, ApiError):
        return False
    return True


def _env_exports(stack: Stack) -> dict[str, str]:
    """`punctual local env`: the export lines, parsed."""
    done = run_punctual(
        "local", "env", "--data", str(stack.data), "--port", stack.url.rsplit(":", 1)[1]
    )
    assert (done.code, done.err) == (0, ""), done.err
    lines = done.out.splitlines()
    assert all(line.startswith("export ") for line in lines), done.out
    return dict(line.removeprefix("export ").split("=", 1) for line in lines)


def launch(data: Path, port: int | None = None, *flags: str) -> Stack:
    """Start `punctual local up FLAGS` on ``data`` (its output in a log there); not waited
    for."""
    port = port or free_port()
    log = data / f"stack-{port}-{time.monotonic_ns()}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            punctual(
                *("local", "up", "--port", str(port), "--data", str(data)),
                *("--tick", str(TICK_SECONDS), "--lookahead", str(LOOKAHEAD_SECONDS)),
                *flags,
            ),
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=_hermetic_environment(),
            cwd=REPO,
        )
    return Stack(f"http://127.0.0.1:{port}", data, process, log)


def wait_until_answering(stack: Stack) -> None:
    """Until GET /v1/meta (signed as demo) answers; StackFailed if `local up` exits first."""
    deadline = time.monotonic() + START_SECONDS
    while not answering(stack):
        if stack.process.poll() is not None:
            raise StackFailed(
                f"`local up` exited with {stack.process.returncode}:\n{tail(stack.log)}"
            )
        if time.monotonic() > deadline:
            raise StackFailed(
                f"the API did not answer within {START_SECONDS} s:\n{tail(stack.log)}"
            )
        time.sleep(0.25)


def ready(stack: Stack) -> Stack:
    """Once its API answers, with the exports `local env` prints for it."""
    wait_until_answering(stack)
    stack.exports = _env_exports(stack)
    return stack


@contextlib.contextmanager
def local_stack(data: Path) -> Iterator[Stack]:
    """A stack on ``data`` until the API answers; stopped and cleaned up after."""
    stack = launch(data)
    try:
        yield ready(stack)
    finally:
        stack.stopped = stop(stack)


def stop(stack: Stack) -> tuple[int | None, list[int]]:
    """SIGINT (Ctrl-C), then kill whatever is left: the exit code and the engines left over."""
    process = stack.process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    leftovers = [engine.pid for engine in recorded(stack.data).values() if engine.alive()]
    for pid in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return process.returncode, leftovers


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("punctual-local")
    try:
        with local_stack(data) as running:
            yield running
    except StackFailed as failed:
        pytest.fail(str(failed))
    # Ctrl-C stops the drivers and the engines: exit 0, no engine left (teardown fails if not).
    assert running.stopped == (0, []), f"unclean stop {running.stopped}:\n{tail(running.log)}"

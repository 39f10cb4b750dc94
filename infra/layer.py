"""The core Lambda layer: the ``punctual`` package plus its runtime dependencies."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, cast

import jsii
from aws_cdk import BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

ROOT = Path(__file__).resolve().parent.parent
LAYER_SOURCE = ROOT / "layers" / "core"
PACKAGE = LAYER_SOURCE / "python" / "punctual"
RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64
PIP_PLATFORM = "manylinux2014_aarch64"
# The runtime package alone: the client (CLI, HTTP client, worker SDK) and the development
# tooling live in their own packages and source roots, which the runtime never imports
# (tests/unit/test_seams.py). The layer is what Lambda runs.


def runtime_requirements() -> list[str]:
    """The [project] dependencies of punctual-core (layers/core/pyproject.toml), which every
    part of the runtime runs on: one list for dev, the client and Lambda, every one pinned
    exactly (the layer is rebuilt at each synthesis)."""
    with (LAYER_SOURCE / "pyproject.toml").open("rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


def pip_install(target: str) -> list[str]:
    """pip's arguments installing the requirements as Lambda-platform wheels, uncompiled."""
    return [
        "install",
        "--quiet",
        "--no-compile",
        "--target",
        target,
        "--platform",
        PIP_PLATFORM,
        "--implementation",
        "cp",
        "--python-version",
        RUNTIME.name.removeprefix("python"),
        "--only-binary=:all:",
        *runtime_requirements(),
    ]


def copy_package(target: Path, source: Path = PACKAGE) -> None:
    """The ``punctual`` package into ``target`` (the layer's python/), without bytecode of
    whichever Python ran the build."""
    shutil.copytree(
        source, target / "punctual", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )


@jsii.implements(ILocalBundling)
class _PipBundler:
    """Bundles without Docker: pip fetches Lambda-platform wheels, our package is copied."""

    def try_bundle(self, output_dir: str, _options: Any) -> bool:
        target = Path(output_dir) / "python"
        subprocess.run([sys.executable, "-m", "pip", *pip_install(str(target))], check=True)
        copy_package(target)
        return True


def docker_command() -> list[str]:
    """The same build in the SAM image, where local bundling is impossible."""
    excludes = ("--exclude=__pycache__", "--exclude=*.pyc")
    return [
        "bash",
        "-c",
        f"pip {shlex.join(pip_install('/asset-output/python'))} "
        f"&& tar -C python {shlex.join(excludes)} -cf - punctual "
        "| tar -C /asset-output/python -xf -",
    ]


class CoreLayer(Construct):
    """One layer shared by every Punctual function."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            description="punctual domain package and its runtime dependencies",
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            code=lambda_.Code.from_asset(
                str(LAYER_SOURCE),
                # (what a build of the punctual-core wheel leaves there is not the layer's)
                exclude=["build", "**/*.egg-info", "**/__pycache__"],
                bundling=BundlingOptions(
                    local=cast(ILocalBundling, _PipBundler()),
                    # Used only where local bundling is impossible.
                    image=DockerImage.from_registry(f"public.ecr.aws/sam/build-{RUNTIME.name}"),
                    command=docker_command(),
                ),
            ),
        )

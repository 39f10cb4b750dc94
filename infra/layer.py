"""The core Lambda layer: the ``punctual`` package plus its runtime dependencies."""

from __future__ import annotations

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
RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64
PIP_PLATFORM = "manylinux2014_aarch64"


def runtime_requirements() -> list[str]:
    """The [project] dependencies of pyproject.toml: one list for dev and for Lambda."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


@jsii.implements(ILocalBundling)
class _PipBundler:
    """Bundles without Docker: pip fetches Lambda-platform wheels, our package is copied."""

    def try_bundle(self, output_dir: str, _options: Any) -> bool:
        target = Path(output_dir) / "python"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(target),
                "--platform",
                PIP_PLATFORM,
                "--implementation",
                "cp",
                "--python-version",
                RUNTIME.name.removeprefix("python"),
                "--only-binary=:all:",
                *runtime_requirements(),
            ],
            check=True,
        )
        shutil.copytree(
            LAYER_SOURCE / "python" / "punctual",
            target / "punctual",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        return True


class CoreLayer(Construct):
    """One layer shared by every Punctual function."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        requirements = " ".join(f"'{r}'" for r in runtime_requirements())
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            description="punctual domain package and its runtime dependencies",
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            code=lambda_.Code.from_asset(
                str(LAYER_SOURCE),
                bundling=BundlingOptions(
                    local=cast(ILocalBundling, _PipBundler()),
                    # Used only where local bundling is impossible.
                    image=DockerImage.from_registry(f"public.ecr.aws/sam/build-{RUNTIME.name}"),
                    command=[
                        "bash",
                        "-c",
                        f"pip install -t /asset-output/python {requirements} "
                        "&& cp -r python/punctual /asset-output/python/",
                    ],
                ),
            ),
        )

"""Synthesize both stacks without the CDK CLI, asset bundling or network, with cdk.json's
context: `python -m infra.offline OUTDIR`. `make test` lints the templates it writes."""

from __future__ import annotations

import json
import sys
from typing import Any

import aws_cdk as cdk

from infra.layer import ROOT
from infra.stack import build

# Which stacks bundle their assets; none: the layer's pip install is skipped.
NO_BUNDLING: dict[str, Any] = {"aws:cdk:bundling-stacks": []}


def cdk_json_context() -> dict[str, Any]:
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text(encoding="utf-8"))["context"]
    return context


def synthesize(outdir: str, context: dict[str, Any]) -> cdk.cx_api.CloudAssembly:
    app = cdk.App(outdir=outdir, context={**context, **NO_BUNDLING})
    build(app)
    return app.synth()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m infra.offline OUTDIR", file=sys.stderr)
        return 2
    assembly = synthesize(argv[0], cdk_json_context())
    for stack in assembly.stacks:
        print(f"{assembly.directory}/{stack.template_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

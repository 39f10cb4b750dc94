"""The synthesized template: the core layer (bundling skipped, no network)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk.assertions import Template

from infra.layer import runtime_requirements
from infra.stack import PunctualStack


def _template() -> Template:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    return Template.from_stack(PunctualStack(app, "Test"))


def test_core_layer_targets_one_python_runtime_on_arm64():
    # GIVEN the stack; WHEN synthesized
    template = _template()
    # THEN exactly one layer exists, for the runtime and architecture the functions use
    template.resource_count_is("AWS::Lambda::LayerVersion", 1)
    template.has_resource_properties(
        "AWS::Lambda::LayerVersion",
        {"CompatibleRuntimes": ["python3.12"], "CompatibleArchitectures": ["arm64"]},
    )


def test_layer_requirements_come_from_pyproject_with_tzdata_pinned():
    # GIVEN pyproject.toml; WHEN the layer reads its requirements
    requirements = runtime_requirements()
    # THEN the zone rules shipped to Lambda are the exact pinned release
    assert any(r.startswith("tzdata==") for r in requirements)
    assert any(r.startswith("pydantic") for r in requirements)

"""The core layer and the settings every function shares."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from infra.layer import runtime_requirements


def test_layer_targets_one_python_runtime_on_arm64(service: Template):
    # THEN exactly one layer exists, for the runtime and architecture the functions use
    service.resource_count_is("AWS::Lambda::LayerVersion", 1)
    service.has_resource_properties(
        "AWS::Lambda::LayerVersion",
        {"CompatibleRuntimes": ["python3.14"], "CompatibleArchitectures": ["arm64"]},
    )


def test_layer_requirements_come_from_pyproject_with_tzdata_pinned():
    # GIVEN pyproject.toml; WHEN the layer reads its requirements
    requirements = runtime_requirements()
    # THEN the zone rules shipped to Lambda are the exact pinned release
    assert any(r.startswith("tzdata==") for r in requirements)
    assert any(r.startswith("pydantic") for r in requirements)


def test_layer_every_function_shares_runtime_layer_tracing_and_json_logs(service: Template):
    # THEN each of the four functions runs python3.14 on arm64 with the layer, active
    # tracing, JSON logs into its own log group, and the Powertools settings
    functions = service.find_resources("AWS::Lambda::Function")
    assert len(functions) == 4
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

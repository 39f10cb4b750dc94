"""The synthesized template (bundling skipped, no network)."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from infra.config import DeployConfig
from infra.layer import runtime_requirements
from infra.materializer import shard_groups
from infra.stack import PunctualStack


@pytest.fixture(scope="module")
def template() -> Template:
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    config = DeployConfig(shard_count=20, shard_group_size=8, map_concurrency=10)
    return Template.from_stack(PunctualStack(app, "Test", config=config))


def test_core_layer_targets_one_python_runtime_on_arm64(template: Template):
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


def test_tables_are_on_demand_with_pitr_and_the_occurrence_stream(template: Template):
    template.resource_count_is("AWS::DynamoDB::Table", 5)
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "TableName": "punctual-occurrences",
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "StreamSpecification": {"StreamViewType": "NEW_IMAGE"},
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        },
    )
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "TableName": "punctual-schedules",
            "GlobalSecondaryIndexes": Match.array_with([Match.object_like({"IndexName": "due"})]),
        },
    )


def test_materializer_runs_every_minute_through_an_express_map(template: Template):
    # THEN an EventBridge rule fires each minute with the shard groups
    template.has_resource_properties("AWS::Events::Rule", {"ScheduleExpression": "rate(1 minute)"})
    # AND the state machine is Express, mapping over groups with bounded concurrency
    template.has_resource_properties(
        "AWS::StepFunctions::StateMachine", {"StateMachineType": "EXPRESS"}
    )
    machine = template.find_resources("AWS::StepFunctions::StateMachine")
    body = str(next(iter(machine.values()))["Properties"]["DefinitionString"])
    assert '\\"MaxConcurrency\\":10' in body or '"MaxConcurrency":10' in body
    assert "GroupLeftForNextTick" in body
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Handler": "materializer.handler.lambda_handler", "Runtime": "python3.12"},
    )


def test_shard_groups_cover_every_shard_once():
    groups = shard_groups(20, 8)
    assert groups == [list(range(8)), list(range(8, 16)), list(range(16, 20))]


def test_deploy_config_rejects_bad_context_with_the_field():
    with pytest.raises(ValueError, match=r"punctual\.shard_count"):
        DeployConfig.from_context({"shard_count": 0})


def test_relay_reads_only_occurrence_inserts_and_reports_item_failures(template: Template):
    # THEN the stream mapping filters to occurrence INSERTs, reports partial failures,
    # bisects, bounds retries and keeps what it could not deliver
    template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "BisectBatchOnFunctionError": True,
            "MaximumRetryAttempts": 10,
            "ParallelizationFactor": 10,
            "FilterCriteria": {
                "Filters": [
                    {
                        "Pattern": Match.serialized_json(
                            {
                                "eventName": ["INSERT"],
                                "dynamodb": {"NewImage": {"sk": {"S": ["OCC"]}}},
                            }
                        )
                    }
                ]
            },
            "DestinationConfig": {"OnFailure": Match.any_value()},
        },
    )

"""The stateful stack: the tables, and how the stateless stack finds them."""

from __future__ import annotations

import json

import aws_cdk as cdk
from aws_cdk.assertions import Match, Template

from infra.config import DeployConfig
from infra.data import GUARD_CODE
from infra.stack import PunctualDataStack
from punctual.dal.tables import ALL_TABLES, DUE_INDEX, OCCURRENCES
from punctual.settings import Settings

from .conftest import Synthesized

SETTINGS = Settings()


def test_data_every_table_is_on_demand_with_pitr_and_protected(data: Template):
    # GIVEN the data stack with cdk.json's defaults (retain, deletion protection)
    # THEN every table of the data model exists, on demand, with point-in-time recovery,
    # deletion protection, and is kept when its stack is deleted
    data.resource_count_is("AWS::DynamoDB::Table", len(ALL_TABLES))
    for spec in ALL_TABLES:
        data.has_resource(
            "AWS::DynamoDB::Table",
            {
                "Properties": Match.object_like(
                    {
                        "TableName": spec.name(SETTINGS),
                        "BillingMode": "PAY_PER_REQUEST",
                        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                        "DeletionProtectionEnabled": True,
                    }
                ),
                "DeletionPolicy": "Retain",
                "UpdateReplacePolicy": "Retain",
            },
        )


def test_data_ttl_is_on_where_the_data_model_ages_items_out(data: Template):
    # THEN each table with a TTL attribute in the data model has TTL on that attribute
    for spec in ALL_TABLES:
        expected = (
            {"AttributeName": spec.ttl_attribute, "Enabled": True}
            if spec.ttl_attribute
            else Match.absent()
        )
        data.has_resource_properties(
            "AWS::DynamoDB::Table",
            {"TableName": spec.name(SETTINGS), "TimeToLiveSpecification": expected},
        )


def test_data_indexes_match_the_table_definitions(data: Template):
    # THEN the due index (the materializer's only read path) is keyed by bucket and due_at
    data.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "TableName": "punctual-schedules",
            "GlobalSecondaryIndexes": Match.array_with(
                [
                    Match.object_like(
                        {
                            "IndexName": DUE_INDEX,
                            "KeySchema": [
                                {"AttributeName": "due_bucket", "KeyType": "HASH"},
                                {"AttributeName": "due_at", "KeyType": "RANGE"},
                            ],
                        }
                    )
                ]
            ),
        },
    )
    # AND every table has exactly the indexes punctual.dal.tables defines
    for spec in ALL_TABLES:
        names = [index.name for index in spec.indexes]
        data.has_resource_properties(
            "AWS::DynamoDB::Table",
            {
                "TableName": spec.name(SETTINGS),
                "GlobalSecondaryIndexes": (
                    [Match.object_like({"IndexName": name}) for name in names]
                    if names
                    else Match.absent()
                ),
            },
        )


def test_data_only_the_occurrences_table_streams_and_its_arn_is_published(data: Template):
    # THEN the occurrences table (the outbox) streams new images; no other table streams
    streaming = data.find_resources(
        "AWS::DynamoDB::Table", {"Properties": {"StreamSpecification": Match.any_value()}}
    )
    assert [r["Properties"]["TableName"] for r in streaming.values()] == [
        OCCURRENCES.name(SETTINGS)
    ]
    (table_id, table) = next(iter(streaming.items()))
    assert table["Properties"]["StreamSpecification"] == {"StreamViewType": "NEW_IMAGE"}
    # AND its stream ARN is an SSM parameter, the way the stateless stack finds it
    data.has_resource_properties(
        "AWS::SSM::Parameter",
        {
            "Name": "/punctual-occurrences/stream-arn",
            "Value": {"Fn::GetAtt": [table_id, "StreamArn"]},
        },
    )


def test_data_stacks_share_no_export(synthesized: Synthesized):
    # GIVEN both stacks
    # THEN the service references tables by name and the stream through SSM: no export,
    # so redeploying either stack never blocks on the other
    assert "Fn::ImportValue" not in json.dumps(synthesized.service_json)
    assert not synthesized.data.find_outputs("*")
    synthesized.service.has_parameter(
        "*",
        {
            "Type": "AWS::SSM::Parameter::Value<String>",
            "Default": "/punctual-occurrences/stream-arn",
        },
    )


def test_data_tables_can_be_made_disposable_for_a_test_account():
    # GIVEN retain_data and deletion_protection switched off
    app = cdk.App()
    config = DeployConfig(retain_data=False, deletion_protection=False)
    # WHEN only the data stack is synthesized
    template = Template.from_stack(PunctualDataStack(app, "Disposable", config=config))
    # THEN no table is protected or retained
    for table in template.find_resources("AWS::DynamoDB::Table").values():
        assert table["Properties"]["DeletionProtectionEnabled"] is False
        assert table["DeletionPolicy"] == "Delete"


def test_data_guards_the_shard_count_with_its_inlined_code(
    data: Template, synthesized: Synthesized
):
    # GIVEN the data stack (its settings' shard count)
    # THEN it holds the guard, given the count deployed and the leases table it is kept in
    [guard] = data.find_resources("Custom::PunctualShardCount").values()
    assert guard["Properties"]["ShardCount"] == synthesized.config.shard_count
    # AND its function runs infra/guard_handler.py as it is, inlined within CloudFormation's
    # 4,096 characters, allowed only to read and write that table
    [function] = [
        f
        for f in data.find_resources("AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == "index.on_event"
    ]
    code = function["Properties"]["Code"]["ZipFile"]
    assert code == GUARD_CODE.read_text(encoding="utf-8")
    assert len(code) <= 4096
    statements = [
        s
        for policy in data.find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "dynamodb:" in json.dumps(s["Action"])
    ]
    assert [sorted(s["Action"]) for s in statements] == [
        ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    ]
    assert "Leases" in json.dumps(statements[0]["Resource"])


def test_data_what_the_peak_writes_is_warmed_and_nothing_else(
    data: Template, synthesized: Synthesized
):
    # GIVEN cdk.json's warm_write_units: 15,000 (the 500k top-of-hour peak writes 14,500
    # units a second to each of these, docs/capacity.md; a new on-demand table serves 4,000)
    assert synthesized.config.warm_write_units == 15_000
    tables = {
        t["Properties"]["TableName"]: t["Properties"]
        for t in data.find_resources("AWS::DynamoDB::Table").values()
    }
    warm = {"WriteUnitsPerSecond": 15_000}
    # THEN the schedules and occurrences tables and the due index are warmed to it
    warmed = {name for name, table in tables.items() if table.get("WarmThroughput") == warm}
    assert warmed == {"punctual-schedules", "punctual-occurrences"}
    assert not any(
        "WarmThroughput" in table for name, table in tables.items() if name not in warmed
    )
    indexes = {
        i["IndexName"]: i.get("WarmThroughput")
        for i in tables["punctual-schedules"]["GlobalSecondaryIndexes"]
    }
    assert indexes == {"due": warm, "by_tenant": None, "by_shard": None}


def test_data_no_warm_throughput_when_the_knob_is_zero():
    # GIVEN a data stack with warm_write_units 0 (AWS's own warm throughput)
    app = cdk.App()
    config = DeployConfig(warm_write_units=0)
    stack = PunctualDataStack(app, "PunctualData", config=config)
    # THEN no table or index names one
    assert "WarmThroughput" not in json.dumps(Template.from_stack(stack).to_json())

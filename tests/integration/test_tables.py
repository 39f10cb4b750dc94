"""create_tables on a data folder that already has tables (the local stack's restarts)."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.dal.common import ConditionFailed, Label, to_dynamo
from punctual.dal.tables import (
    OCCURRENCES,
    SCHEDULES,
    SHARD_INDEX,
    SHARD_INDEX_ATTRIBUTES,
    SchemaMismatch,
    create_tables,
)
from punctual.services import Services
from punctual.settings import Settings
from punctual_local.dynamodb import start as start_dynamodb_local
from tests.integration.conftest import Api
from tests.integration.helpers import make, table_items


def test_create_tables_again_keeps_the_existing_tables_and_their_items(aws: Services, alice: Api):
    # GIVEN tables with items (alice's tenant, principal and target)
    before = table_items(aws, aws.settings.tenants_table)
    assert before
    updates: list[str] = []
    aws.dynamodb.meta.events.register(
        "before-parameter-build.dynamodb.UpdateTable",
        lambda params, **_: updates.append(params["TableName"]),
    )
    # WHEN create_tables runs again (a restart on the same data); THEN nothing is lost, and
    # no index is rebuilt (each projects what this version reads already)
    create_tables(aws.dynamodb, aws.settings)
    assert table_items(aws, aws.settings.tenants_table) == before
    assert updates == []


def test_create_tables_refuses_an_occurrences_table_with_the_old_keys(aws: Services):
    # GIVEN an occurrences table made by an older version (keyed by occurrence_id)
    name = OCCURRENCES.name(aws.settings)
    aws.dynamodb.delete_table(TableName=name)
    aws.dynamodb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "occurrence_id", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "occurrence_id", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
    )
    # WHEN create_tables runs; THEN it stops with one clear reason and what to do, instead of
    # failing on the first occurrence write
    with pytest.raises(SchemaMismatch) as refused:
        create_tables(aws.dynamodb, aws.settings)
    assert str(refused.value).startswith(f"table {name} has keys (occurrence_id, sk), this")
    assert str(refused.value).endswith(
        "made by an older Punctual; start on a new data folder (or delete the old one)"
    )


def test_create_tables_rebuilds_an_index_an_older_version_projected_otherwise(
    settings: Settings,
) -> None:
    # GIVEN a DynamoDB Local of its own, as the local stack runs one (the tests' shared
    # engine holds hundreds of tables, and its deletion of an index takes minutes there),
    # whose schedules table has a shard index made before it projected manual_through,
    # holding an item that has it
    engine = start_dynamodb_local()
    try:
        client: Any = engine.client()
        create_tables(client, settings)
        name = SCHEDULES.name(settings)
        request = SCHEDULES.create_request(settings)
        older = [a for a in SHARD_INDEX_ATTRIBUTES if a != "manual_through"]
        for index in request["GlobalSecondaryIndexes"]:
            if index["IndexName"] == SHARD_INDEX:
                index["Projection"] = {"ProjectionType": "INCLUDE", "NonKeyAttributes": older}
        client.delete_table(TableName=name)
        client.create_table(**request)
        item = {"schedule_id": "sch_1", "sk": "CURRENT", "shard": 3, "created_key": "a#sch_1"}
        client.put_item(TableName=name, Item=to_dynamo(item | {"manual_through": 1234}))

        def seen_in_the_index() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = client.query(
                TableName=name,
                IndexName=SHARD_INDEX,
                KeyConditionExpression="#s = :s",
                ExpressionAttributeNames={"#s": "shard"},
                ExpressionAttributeValues=to_dynamo({":s": 3}),
            )["Items"]
            return found

        assert "manual_through" not in seen_in_the_index()[0]
        # WHEN create_tables runs on it (the local stack's restart after an upgrade)
        create_tables(client, settings)
        # THEN the index projects what this version reads, filled from the table; the item
        # is kept
        [seen] = seen_in_the_index()
        assert seen["manual_through"] == {"N": "1234"}
        assert len(client.scan(TableName=name)["Items"]) == 1
    finally:
        engine.stop()


def test_the_repairs_schedule_check_holds_only_while_the_cursor_is_past_the_instant(
    aws: Services, alice: Api
):
    # GIVEN an ACTIVE cron whose cursor stands at planned_until (the API planned its horizon)
    schedule_id = make(aws, spec={"kind": "cron", "expression": "* * * * *", "timezone": "UTC"})
    stored = aws.schedules.current(schedule_id)
    assert stored is not None
    assert stored.schedule.planned_until is not None
    schedule, planned = stored.schedule, stored.schedule.planned_until

    def commit(stepped_past: int | None) -> None:
        check = aws.schedules.unchanged_action(schedule, stepped_past=stepped_past)
        aws.transactions.commit([(Label.SCHEDULE, check)])

    # THEN a repair of fires up to the cursor, or of older versions' only, passes the check
    commit(planned)
    commit(None)
    # AND one past the cursor is refused: the materializer has not planned that instant
    # yet, and its own put of the same occurrence would fail and stall the shard
    with pytest.raises(ConditionFailed) as refused:
        commit(planned + 60)
    assert refused.value.label == Label.SCHEDULE

"""The fault layer itself (tests/faults.py): a lagging replica must serve what DynamoDB's
eventually consistent reads can, and nothing they cannot, or the tests that lean on it
prove nothing."""

from __future__ import annotations

from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Clock

SKS = ("OCC#1", "OCC#5", "OCC#9")


def _ends_deleted_through_a_lagging_replica(aws: Services, clock: Clock) -> FaultyDynamoDB:
    """Three items of one partition (SKS), the first and the last deleted a moment ago
    through a replica a minute behind: that replica."""
    table = aws.settings.occurrences_table
    replica = FaultyDynamoDB(aws.dynamodb, Faults(FaultPlan(stale=1.0, stale_seconds=60), clock))
    for sk in SKS:
        aws.dynamodb.put_item(TableName=table, Item={"schedule_id": {"S": "s"}, "sk": {"S": sk}})
    clock.advance(120)
    for sk in ("OCC#1", "OCC#9"):
        replica.delete_item(TableName=table, Key={"schedule_id": {"S": "s"}, "sk": {"S": sk}})
    return replica


def test_a_lagging_replica_serves_deleted_items_only_within_the_querys_sort_key_range(
    aws: Services, clock: Clock
) -> None:
    # GIVEN three items of one partition, the first and the last deleted a moment ago through
    # a replica a minute behind
    table = aws.settings.occurrences_table
    replica = _ends_deleted_through_a_lagging_replica(aws, clock)

    def served(condition: str, **bounds: str) -> list[str]:
        answer = replica.query(
            TableName=table,
            KeyConditionExpression=f"schedule_id = :s AND {condition}",
            ExpressionAttributeValues={":s": {"S": "s"}}
            | {f":{k}": {"S": v} for k, v in bounds.items()},
        )
        return sorted(i["sk"]["S"] for i in answer["Items"])

    # THEN a query of the whole range still sees them (the lag), and one of a part of the
    # partition sees only what lies in it, as DynamoDB would
    assert served("sk BETWEEN :a AND :b", a="OCC#0", b="OCC#9") == list(SKS)
    assert served("sk BETWEEN :a AND :b", a="OCC#4", b="OCC#6") == ["OCC#5"]
    assert served("begins_with(sk, :p)", p="OCC#9") == ["OCC#9"]
    assert served("sk < :c", c="OCC#5") == ["OCC#1"]


def test_a_lagging_replica_serves_a_page_in_its_sort_key_order_old_images_in_their_places(
    aws: Services, clock: Clock
) -> None:
    # GIVEN three items of one partition, the first and the last deleted a moment ago through
    # a replica a minute behind
    table = aws.settings.occurrences_table
    replica = _ends_deleted_through_a_lagging_replica(aws, clock)

    def served(forward: bool) -> list[str]:
        answer = replica.query(
            TableName=table,
            KeyConditionExpression="schedule_id = :s",
            ExpressionAttributeValues={":s": {"S": "s"}},
            ScanIndexForward=forward,
        )
        return [i["sk"]["S"] for i in answer["Items"]]

    # THEN a query meets them in the order DynamoDB returns a page in (by the sort key, either
    # way), not the items it still holds first and what the lag keeps after them
    assert served(forward=True) == list(SKS)
    assert served(forward=False) == list(reversed(SKS))

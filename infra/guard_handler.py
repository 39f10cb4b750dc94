"""The shard-count guard (a CloudFormation custom resource of the data stack; this file is
its whole code, inlined): a deploy whose shard count is below the largest ever deployed
fails, and CloudFormation rolls the stack back. A schedule keeps the shard it was homed
in, while the materializer's walk and the reconciler cover only the shards deployed: the
schedules in the shards above a lower count would never fire again, without an error.

The count is kept in the leases table (retained with the data), so neither a deploy with
other settings nor a deleted and re-made stack can lower it. Standard library and boto3
only: it runs without Punctual's layer.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import boto3
from botocore.exceptions import ClientError

KEY = {"pk": {"S": "DEPLOYED#shard_count"}}


def record(client: Any, table: str, count: int) -> int | None:
    """Record ``count`` as the deployed shard count; the count recorded before when it is
    larger (then nothing is written, and the deploy must fail)."""
    try:
        client.update_item(
            TableName=table,
            Key=KEY,
            UpdateExpression="SET shard_count = :n",
            # Race: two deploys with different counts at once; whichever writes second
            # still sees the larger one, and a lower count never replaces it.
            ConditionExpression="attribute_not_exists(shard_count) OR shard_count <= :n",
            ExpressionAttributeValues={":n": {"N": str(count)}},
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        found = client.get_item(TableName=table, Key=KEY, ConsistentRead=True)["Item"]
        return int(found["shard_count"]["N"])
    return None


def refusal(count: int, deployed: int) -> str:
    return (
        f"shard_count {count} is below the {deployed} shards deployed before: the schedules "
        f"homed in shards {count}-{deployed - 1} would never fire again. Deploy "
        f"shard_count {deployed} or more (docs/deploy.md, Shard count)."
    )


def decide(event: dict[str, Any], client: Any) -> tuple[str, str]:
    """(status, reason) of the CloudFormation answer to ``event``."""
    if event["RequestType"] == "Delete":
        return "SUCCESS", "the recorded count stays in the table"
    properties = event["ResourceProperties"]
    count = int(properties["ShardCount"])
    deployed = record(client, properties["Table"], count)
    if deployed is not None:
        return "FAILED", refusal(count, deployed)
    return "SUCCESS", f"shard_count {count} recorded"


def on_event(event: dict[str, Any], context: Any) -> None:
    try:
        status, reason = decide(event, boto3.client("dynamodb"))
    except Exception as error:  # any failure must still answer, or the stack waits an hour
        status, reason = "FAILED", f"{type(error).__name__}: {error}"[:500]
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason,
            "PhysicalResourceId": "punctual-shard-count",
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": ""}
    )
    with urllib.request.urlopen(request, timeout=30):
        pass

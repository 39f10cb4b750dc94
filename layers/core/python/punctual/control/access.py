"""What a tenant's workers may touch, as an IAM policy Punctual writes for them.

The worker SDK reads and writes Punctual's tables directly (claims, leases, attempts). A
tenant is untrusted: its workers' role must not reach another tenant's items whatever
calls it makes. The key design makes that expressible in IAM (docs/security.md):

- every item of a tenant's schedules and occurrences has a partition key beginning
  ``sch_<tenant>.`` (punctual.domain.ids.schedule_key_prefix);
- its run slots live under ``R#<tenant>`` in the tenants table, apart from its record
  ``T#<tenant>`` (quotas and usage), which workers may read but not write;
- its queues are named ``<prefix>-<tenant>_<target>`` and ``...__<target>`` (DLQ).

``dynamodb:LeadingKeys`` then scopes every DynamoDB action to those partitions, and the
queue ARNs to the tenant's names. No action that reads or writes without a partition key
(Scan, BatchWriteItem's deletes, DeleteItem) is granted.
"""

from __future__ import annotations

from typing import Any

from punctual.dal.runs import run_partition
from punctual.dal.tenants import tenant_partition
from punctual.domain.ids import schedule_key_prefix
from punctual.settings import Settings

# Exactly what the worker SDK calls (tests/infrastructure/inventory.txt, "call worker"):
# the claim's read (BatchGetItem), the schedule's version (GetItem: after the claim and for
# the cooperative cancel); updates of its own occurrences (claim, heartbeat, completion,
# refusal). No PutItem: a worker makes no item of ours. (UpdateItem can still create an
# item under the tenant's own prefix: such an item reaches only its own queues,
# docs/security.md.)
SCHEDULE_READS = ["dynamodb:GetItem", "dynamodb:BatchGetItem"]
OCCURRENCE_ACTIONS = ["dynamodb:BatchGetItem", "dynamodb:UpdateItem"]
TENANT_READS = ["dynamodb:GetItem", "dynamodb:BatchGetItem"]
SLOT_WRITES = ["dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"]
QUEUE_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
    "sqs:GetQueueUrl",
    "sqs:SendMessage",
]


def _table(settings: Settings, name: str) -> str:
    return f"arn:{settings.partition}:dynamodb:{settings.region}:{settings.account_id}:table/{name}"


def _keys(operator: str, keys: list[str]) -> dict[str, Any]:
    # ForAllValues holds vacuously for a request without keys: Null rules that out.
    return {
        f"ForAllValues:{operator}": {"dynamodb:LeadingKeys": keys},
        "Null": {"dynamodb:LeadingKeys": "false"},
    }


def worker_policy(tenant_id: str, settings: Settings) -> dict[str, Any]:
    """The identity policy for the role the tenant's workers run as (in this account)."""
    own = [schedule_key_prefix(tenant_id) + "*"]
    queues = (
        f"arn:{settings.partition}:sqs:{settings.region}:{settings.account_id}:"
        f"{settings.queue_prefix}-{tenant_id}_*"
    )
    statements = [
        ("ReadOwnSchedules", SCHEDULE_READS, settings.schedules_table, _keys("StringLike", own)),
        (
            "OwnOccurrences",
            OCCURRENCE_ACTIONS,
            settings.occurrences_table,
            _keys("StringLike", own),
        ),
        (
            "ReadOwnTenantRecordAndSlots",
            TENANT_READS,
            settings.tenants_table,
            _keys("StringEquals", [tenant_partition(tenant_id), run_partition(tenant_id)]),
        ),
        (
            "OwnRunSlots",
            SLOT_WRITES,
            settings.tenants_table,
            _keys("StringEquals", [run_partition(tenant_id)]),
        ),
    ]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": sid,
                "Effect": "Allow",
                "Action": actions,
                "Resource": _table(settings, table),
                "Condition": condition,
            }
            for sid, actions, table, condition in statements
        ]
        + [{"Sid": "OwnQueues", "Effect": "Allow", "Action": QUEUE_ACTIONS, "Resource": queues}],
    }

"""A hostile tenant's worker: the DynamoDB calls its generated IAM policy allows, and only
those, as IAM would judge them (punctual.control.access.worker_policy).

A tenant is untrusted, its workers too (docs/security.md): whatever the policy lets its
credentials write, assume it writes, malformed. IAM cannot require a ConditionExpression,
so an UpdateItem under the tenant's own keys may create a missing item with any
attributes; this client makes exactly such calls, and refuses (AccessDenied) any the
policy would deny.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from botocore.exceptions import ClientError

from punctual.control.access import worker_policy
from punctual.settings import Settings


def allows(policy: dict[str, Any], action: str, resource: str, keys: list[str]) -> bool:
    """IAM's answer for one call, for the elements the workers' policy uses: Allow
    statements (nothing allowed is denied), exact or wildcard resources, and the
    ForAllValues / Null conditions on dynamodb:LeadingKeys."""
    for statement in policy["Statement"]:
        if action not in statement["Action"]:
            continue
        if not fnmatch.fnmatchcase(resource, statement["Resource"]):
            continue
        condition = statement.get("Condition", {})
        if condition.get("Null", {}).get("dynamodb:LeadingKeys") == "false" and not keys:
            continue
        like = condition.get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys")
        equal = condition.get("ForAllValues:StringEquals", {}).get("dynamodb:LeadingKeys")
        if like is not None and not all(any(fnmatch.fnmatchcase(k, p) for p in like) for k in keys):
            continue
        if equal is not None and not all(k in equal for k in keys):
            continue
        return True
    return False


class HostileWorker:
    """DynamoDB as the tenant's worker credentials reach it: each call checked against the
    tenant's worker policy (AccessDenied otherwise), then made for real."""

    def __init__(self, real: Any, tenant_id: str, settings: Settings) -> None:
        self._real = real
        self._settings = settings
        self.policy = worker_policy(tenant_id, settings)
        self.denied: list[tuple[str, str]] = []

    def _resource(self, table: str) -> str:
        s = self._settings
        return f"arn:{s.partition}:dynamodb:{s.region}:{s.account_id}:table/{table}"

    def _check(self, action: str, table: str, keys: list[str]) -> None:
        if not allows(self.policy, f"dynamodb:{action}", self._resource(table), keys):
            self.denied.append((action, table))
            raise ClientError(
                {"Error": {"Code": "AccessDeniedException", "Message": "denied by IAM"}}, action
            )

    @staticmethod
    def _leading(key: dict[str, Any]) -> str:
        name = "schedule_id" if "schedule_id" in key else "pk"
        return str(next(iter(key[name].values())))

    def update_item(self, **request: Any) -> Any:
        self._check("UpdateItem", request["TableName"], [self._leading(request["Key"])])
        return self._real.update_item(**request)

    def put_item(self, **request: Any) -> Any:
        self._check("PutItem", request["TableName"], [self._leading(request["Item"])])
        return self._real.put_item(**request)

    def delete_item(self, **request: Any) -> Any:
        self._check("DeleteItem", request["TableName"], [self._leading(request["Key"])])
        return self._real.delete_item(**request)

    def get_item(self, **request: Any) -> Any:
        self._check("GetItem", request["TableName"], [self._leading(request["Key"])])
        return self._real.get_item(**request)

    def write(self, table: str, key: dict[str, Any], attributes: dict[str, Any]) -> None:
        """SET each of ``attributes`` (DynamoDB JSON values) on ``key``, with no condition:
        the item is made if it does not exist."""
        names = {f"#a{i}": name for i, name in enumerate(attributes)}
        self.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET " + ", ".join(f"{n} = :v{n[2:]}" for n in names),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={
                f":v{i}": value for i, value in enumerate(attributes.values())
            },
        )

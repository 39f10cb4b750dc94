"""The tenants table: tenant records (quotas, usage), principal bindings, targets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from punctual.dal.common import (
    ConditionFailed,
    Item,
    decode_token,
    dynamo,
    encode_token,
    from_dynamo,
    to_dynamo,
    values,
)
from punctual.dal.tables import TENANTS
from punctual.domain.errors import Conflict, NotFound
from punctual.domain.tenancy import Quotas, Target, Tenant

TENANT_SK = "TENANT"
# A tenant listing's Scan: items read a page (tenants and the rest), and pages a call.
SCAN_PAGE_ITEMS = 500
SCAN_PAGES = 8
PRINCIPAL_SK = "PRINCIPAL"
MINUTES = range(60)


def tenant_partition(tenant_id: str) -> str:
    """The tenant's record and targets: operators and the API write it, workers only read."""
    return f"T#{tenant_id}"


def tenant_key(tenant_id: str) -> dict[str, Any]:
    return to_dynamo({"pk": tenant_partition(tenant_id), "sk": TENANT_SK})


def _minute_attr(minute: int) -> str:
    return f"f{minute:02d}"


# --- item <-> model -------------------------------------------------------------------


def tenant_to_item(tenant: Tenant) -> Item:
    item: Item = {
        "pk": f"T#{tenant.tenant_id}",
        "sk": TENANT_SK,
        "tenant_id": tenant.tenant_id,
        "quotas": tenant.quotas.model_dump(),
        "schedule_count": tenant.schedule_count,
        "created_at": tenant.created_at.isoformat(),
    }
    item.update({_minute_attr(m): tenant.minute_load[m] for m in MINUTES})
    return item


def tenant_from_item(item: Item) -> Tenant:
    return Tenant(
        tenant_id=item["tenant_id"],
        quotas=Quotas(**item["quotas"]),
        schedule_count=item["schedule_count"],  # (tenant_to_item writes every usage attribute)
        minute_load=[item[_minute_attr(m)] for m in MINUTES],
        created_at=datetime.fromisoformat(item["created_at"]),
        principals=sorted(item.get("principals", ())),
        manual_minute=item.get("manual_minute", 0),
        manual_runs=item.get("manual_runs", 0),
    )


def target_to_item(target: Target) -> Item:
    return {
        "pk": f"T#{target.tenant_id}",
        "sk": f"TARGET#{target.name}",
        **target.model_dump(mode="json"),
    }


def target_from_item(item: Item) -> Target:
    return Target(**{k: v for k, v in item.items() if k not in ("pk", "sk")})


# --- reads and writes -----------------------------------------------------------------


class TenantStore:
    def __init__(self, client: Any, table: str) -> None:
        self._client = dynamo(client)
        self.table = table

    def create(self, tenant: Tenant) -> None:
        try:
            self._client.put_item(
                TableName=self.table,
                Item=to_dynamo(tenant_to_item(tenant)),
                # Race: two operators creating the same tenant; the second must not reset
                # usage.
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ConditionFailed:
            raise Conflict(f"tenant {tenant.tenant_id} already exists") from None

    def get(self, tenant_id: str) -> Tenant:
        found = self._client.get_item(
            TableName=self.table, Key=tenant_key(tenant_id), ConsistentRead=True
        ).get("Item")
        if not found:
            raise NotFound(f"tenant {tenant_id} not found")
        return tenant_from_item(from_dynamo(found))

    def list_tenants(self, *, limit: int, token: str | None) -> tuple[list[Tenant], str | None]:
        """Up to ``limit`` tenants (in the table's order) and the token of the next page. An
        operator's listing: a Scan, the table's other items (targets, principals, the
        workers' slots) filtered out, eventually consistent (a tenant made a moment ago shows
        on the next listing). Pages the filter empties are read past, at most SCAN_PAGES a
        call: a listing then answers what it found and a token, never loops on them."""
        start = decode_token(token, expect={}, keys=TENANTS.page_key())
        found: list[Tenant] = []
        for _ in range(SCAN_PAGES):
            request: dict[str, Any] = {
                "TableName": self.table,
                # Only tenant records: under T#, a partition no tenant's worker may write (its
                # slot items, whatever their sort key, are under R#<tenant>: access.py).
                "FilterExpression": "sk = :tenant AND begins_with(pk, :records)",
                "ExpressionAttributeValues": values(tenant=TENANT_SK, records=tenant_partition("")),
                "Limit": SCAN_PAGE_ITEMS,
            }
            if start:
                request["ExclusiveStartKey"] = start
            page = self._client.scan(**request)
            for item in page["Items"]:
                found.append(tenant_from_item(from_dynamo(item)))
                if len(found) == limit:
                    # The next page starts after this item (any item's key is a start key).
                    return found, encode_token({"pk": item["pk"], "sk": item["sk"]})
            start = page.get("LastEvaluatedKey")
            if not start:
                return found, None
        return found, encode_token(start)

    def set_quotas(self, tenant_id: str, quotas: Quotas) -> None:
        try:
            self._set_quotas(tenant_id, quotas)
        except ConditionFailed:
            raise NotFound(f"tenant {tenant_id} not found") from None

    def _set_quotas(self, tenant_id: str, quotas: Quotas) -> None:
        self._client.update_item(
            TableName=self.table,
            Key=tenant_key(tenant_id),
            UpdateExpression="SET quotas = :q",
            # Race: quotas set on a tenant being created must not create a partial item.
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues=values(q=quotas.model_dump()),
        )

    def bind_principal(self, principal_arn: str, tenant_id: str) -> None:
        self.get(tenant_id)
        try:
            self._client.put_item(
                TableName=self.table,
                Item=to_dynamo(
                    {
                        "pk": f"P#{principal_arn}",
                        "sk": PRINCIPAL_SK,
                        "tenant_id": tenant_id,
                    }
                ),
                # Race: one principal bound to two tenants would see both; first bind wins,
                # re-binding to the same tenant is a no-op.
                ConditionExpression="attribute_not_exists(pk) OR tenant_id = :t",
                ExpressionAttributeValues=values(t=tenant_id),
            )
        except ConditionFailed:
            raise Conflict(f"{principal_arn} is bound to another tenant") from None
        # The tenant keeps the set of its principals: its queues' policies grant them.
        self._client.update_item(
            TableName=self.table,
            Key=tenant_key(tenant_id),
            UpdateExpression="ADD principals :p",
            ExpressionAttributeValues={":p": {"SS": [principal_arn]}},
        )

    def tenant_of(self, principal_arn: str) -> str | None:
        found = self._client.get_item(
            TableName=self.table,
            Key=to_dynamo({"pk": f"P#{principal_arn}", "sk": PRINCIPAL_SK}),
        ).get("Item")
        return str(from_dynamo(found)["tenant_id"]) if found else None

    def release_action(self, tenant_id: str, released: dict[str, int]) -> dict[str, Any]:
        """A transaction action giving usage back (``released``: usage attributes -> amounts,
        from ``released_usage``): never refused, so no quota condition."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": tenant_key(tenant_id),
                "UpdateExpression": "ADD " + ", ".join(f"{k} :d{k}" for k in released),
                "ExpressionAttributeValues": values(**{f"d{k}": -v for k, v in released.items()}),
            }
        }

    def put_target(self, target: Target) -> None:
        try:
            self._client.put_item(
                TableName=self.table,
                Item=to_dynamo(target_to_item(target)),
                # Race: two creates of one target name; the first one's queues are the
                # target.
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ConditionFailed:
            raise Conflict(f"target {target.name} already exists") from None

    def set_early_delivery(self, tenant_id: str, name: str, early: bool) -> Target:
        """Turns the target's early delivery on or off; NotFound for no such target."""
        try:
            found = self._client.update_item(
                TableName=self.table,
                Key=to_dynamo({"pk": f"T#{tenant_id}", "sk": f"TARGET#{name}"}),
                UpdateExpression="SET early_delivery = :early",
                # Race: an update of a name no target has (or not yet: a create still under
                # way) would make an item of one attribute; it is refused, nothing written.
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues=values(early=early),
                ReturnValues="ALL_NEW",
            )
        except ConditionFailed:
            raise NotFound(f"target {name} not found") from None
        return target_from_item(from_dynamo(found["Attributes"]))

    def get_target(self, tenant_id: str, name: str, *, consistent: bool = False) -> Target | None:
        """Eventually consistent unless asked: a miss is then only "not seen yet" for a target
        created a moment ago; callers that act on a miss read again consistently."""
        found = self._client.get_item(
            TableName=self.table,
            Key=to_dynamo({"pk": f"T#{tenant_id}", "sk": f"TARGET#{name}"}),
            ConsistentRead=consistent,
        ).get("Item")
        return target_from_item(from_dynamo(found)) if found else None

    def list_targets(self, tenant_id: str, *, consistent: bool = False) -> list[Target]:
        """Eventually consistent unless asked (a target made a moment ago may be missing)."""
        pages = self._client.query_pages(
            TableName=self.table,
            ConsistentRead=consistent,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues=values(pk=f"T#{tenant_id}", prefix="TARGET#"),
        )
        return [target_from_item(from_dynamo(i)) for page in pages for i in page["Items"]]


def released_usage(schedules: int, load: dict[int, int]) -> dict[str, int]:
    """What completed schedules give back, by usage attribute (positive amounts)."""
    return _usage_adds(schedules, load)


def _usage_adds(schedules_delta: int, load_delta: dict[int, int]) -> dict[str, int]:
    adds = {"schedule_count": schedules_delta} if schedules_delta else {}
    adds.update({_minute_attr(m): d for m, d in sorted(load_delta.items()) if d})
    return adds


def usage_update(
    tenant_id: str,
    table: str,
    quotas: Quotas,
    *,
    schedules_delta: int,
    load_delta: dict[int, int],
) -> dict[str, Any] | None:
    """A transaction action moving the tenant's usage, guarded by its quotas.

    Growth is conditional: the schedule count and every minute whose load grows must
    stay within the quota after the change. Shrinking is never refused.
    """
    adds = _usage_adds(schedules_delta, load_delta)
    conditions = ["attribute_exists(pk)"]
    bound: dict[str, int] = {}
    if schedules_delta > 0:
        # Race: concurrent creates racing past max_schedules; the count is checked in the
        # same transaction that writes the schedule, so no interleaving can exceed it.
        conditions.append("schedule_count <= :max_schedules")
        bound["max_schedules"] = quotas.max_schedules - schedules_delta
    for minute, delta in sorted(load_delta.items()):
        if delta > 0:
            # Race: concurrent creates/updates filling one minute past the strict-fire quota.
            attr = _minute_attr(minute)
            conditions.append(f"{attr} <= :c{attr}")
            bound[f"c{attr}"] = quotas.max_strict_fires_per_minute - delta
    if not adds:
        return None
    update: dict[str, Any] = {
        "TableName": table,
        "Key": tenant_key(tenant_id),
        "ConditionExpression": " AND ".join(conditions),
    }
    update["UpdateExpression"] = "ADD " + ", ".join(f"{k} :d{k}" for k in adds)
    update["ExpressionAttributeValues"] = values(**{f"d{k}": v for k, v in adds.items()}, **bound)
    update["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return {"Update": update}


def manual_run_update(tenant: Tenant, table: str, minute: int) -> dict[str, Any]:
    """A transaction action counting one manual run (run now) in ``minute`` (a UTC minute's
    start) against the tenant's max_manual_runs_per_minute, as ``tenant`` was read. The
    caller refuses a run over the quota before writing; the condition settles races."""
    if tenant.manual_minute == minute:
        # Race: concurrent run-now requests of one minute counting past the quota together;
        # the count is checked in the transaction that writes the occurrence.
        condition = "manual_minute = :m AND manual_runs < :limit"
        expression = "SET manual_runs = manual_runs + :one"
        named = {"m": minute, "limit": tenant.quotas.max_manual_runs_per_minute, "one": 1}
    else:
        # Race: another request opened this minute's count since the read (the caller reads
        # the tenant again and counts on top of it), or the tenant is gone.
        condition = (
            "attribute_exists(pk) AND (attribute_not_exists(manual_minute) OR manual_minute < :m)"
        )
        expression = "SET manual_minute = :m, manual_runs = :one"
        named = {"m": minute, "one": 1}
    return {
        "Update": {
            "TableName": table,
            "Key": tenant_key(tenant.tenant_id),
            "UpdateExpression": expression,
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values(**named),
        }
    }

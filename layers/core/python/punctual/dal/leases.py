"""The leases table: one item per shard with its lease, fencing token and watermark, and
the shard's pending quota releases (one item per shard and tenant)."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from punctual.dal.common import ConditionFailed, Item, dynamo, from_dynamo, to_dynamo, values

PENDING = "pending_releases"  # on the shard item: tenants with a release not yet handed over
BOOTSTRAP_SECONDS = 3600  # a shard's first watermark is this far before its opener's clock


@dataclass(frozen=True, slots=True)
class Lease:
    shard: int
    fence: int  # grows by one with every claim: a later claim always has a larger token
    watermark: int  # the first minute bucket not yet fully processed (epoch seconds)
    pending: frozenset[str] = frozenset()  # tenants whose released quota waits on this shard


def _shard_pk(shard: int) -> str:
    return f"SHARD#{shard:04d}"


def shard_key(shard: int) -> dict[str, Any]:
    return to_dynamo({"pk": _shard_pk(shard)})


def watermark_of(item: Item | None) -> int | None:
    """A shard item's watermark (from a read or a refused condition's old item); None when
    the shard was never opened."""
    return int(item["watermark"]) if item is not None and "watermark" in item else None


def release_key(shard: int, tenant_id: str) -> dict[str, Any]:
    """The shard's tally of quota released by completed schedules of one tenant, not yet
    handed over to the tenant's usage."""
    return to_dynamo({"pk": f"RELEASE#{shard:04d}#{tenant_id}"})


class LeaseStore:
    def __init__(self, client: Any, table: str) -> None:
        self._client = dynamo(client)
        self.table = table

    def claim(self, shard: int, holder: str, *, now: int, ttl: int, start_at: int) -> Lease | None:
        """Take the shard's lease if it is free, expired or already ours; None if it is busy."""
        try:
            answer = self._client.update_item(
                TableName=self.table,
                Key=shard_key(shard),
                UpdateExpression=(
                    "SET holder = :me, expires_at = :until, "
                    "fence = if_not_exists(fence, :zero) + :one, "
                    "watermark = if_not_exists(watermark, :start)"
                ),
                # Race: two materializers on one shard; only one may hold it at a time, and a
                # crashed holder's lease is taken over once it expires.
                ConditionExpression=(
                    "attribute_not_exists(pk) OR expires_at < :now OR holder = :me"
                ),
                ExpressionAttributeValues=values(
                    me=holder, until=now + ttl, zero=0, one=1, start=start_at, now=now
                ),
                ReturnValues="ALL_NEW",
            )
        except ConditionFailed:
            return None
        item = from_dynamo(answer["Attributes"])
        return Lease(shard, item["fence"], item["watermark"], frozenset(item.get(PENDING, ())))

    def open(self, shard: int, *, now: int) -> None:
        """Give the shard a watermark if it has none, an hour before ``now``. A schedule is
        placed in a shard's due index only once the shard has one (``not_walked_action``): a first
        claim starts its walk near its own tick, and would never read a bucket placed before
        it while the materializer was down."""
        with suppress(ConditionFailed):
            self._client.put_item(
                TableName=self.table,
                Item=to_dynamo(
                    {
                        "pk": _shard_pk(shard),
                        "watermark": now - now % 60 - BOOTSTRAP_SECONDS,
                        "expires_at": 0,  # free: the first claim takes it
                    }
                ),
                # Race: the materializer's first claim or another writer opened it
                # first; its watermark, perhaps walked on since, stands.
                ConditionExpression="attribute_not_exists(pk)",
            )

    def watermark(self, shard: int) -> int | None:
        """The shard's watermark (None: never opened), strongly consistent: it moves every
        minute, and whoever acts on a bucket behind it must see where the walk stands."""
        found = self._client.get_item(
            TableName=self.table, Key=shard_key(shard), ConsistentRead=True
        ).get("Item")
        return watermark_of(from_dynamo(found) if found else None)

    def not_walked_action(self, shard: int, minute: int) -> dict[str, Any]:
        """A transaction action that fails once the shard's walk has reached ``minute``."""
        return {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": shard_key(shard),
                # Race: a schedule placed in a due bucket that the materializer has already
                # walked (a slow or retried commit, a skewed clock) would never be read again.
                # The walk reads bucket W only once the watermark is W, so a bucket after the
                # stored watermark is still ahead of it. A shard with no watermark yet fails
                # too (the writer opens it and retries): its first claim would start its
                # walk near its own tick, past this bucket.
                "ConditionExpression": "watermark < :m",
                "ExpressionAttributeValues": values(m=minute),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def still_mine_action(
        self, lease: Lease, pending: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """A transaction action that fails once another materializer has claimed the shard;
        with ``pending``, it also records those tenants' releases as waiting on the shard."""
        # Race: a holder that stalled past its lease (GC pause, slow network) and was taken
        # over must not commit anything afterwards: the fence has moved on.
        fenced: dict[str, Any] = {
            "TableName": self.table,
            "Key": shard_key(lease.shard),
            "ConditionExpression": "fence = :fence",
            "ExpressionAttributeValues": values(fence=lease.fence),
        }
        if not pending:
            return {"ConditionCheck": fenced}
        fenced["UpdateExpression"] = f"ADD {PENDING} :p"
        fenced["ExpressionAttributeValues"][":p"] = {"SS": sorted(pending)}
        return {"Update": fenced}

    def tally_release_action(
        self, lease: Lease, tenant_id: str, adds: dict[str, int]
    ) -> dict[str, Any]:
        """A transaction action adding to the shard's tally of one tenant's released usage
        (usage attribute -> amount). Only the fenced holder writes it, in the transaction
        that completes the schedules; ``hand_over_actions`` moves it to the tenant."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": release_key(lease.shard, tenant_id),
                "UpdateExpression": "ADD " + ", ".join(f"{k} :d{k}" for k in adds),
                "ExpressionAttributeValues": values(**{f"d{k}": v for k, v in adds.items()}),
            }
        }

    def release_tally(self, lease: Lease, tenant_id: str) -> dict[str, int]:
        """The tally waiting for one tenant, strongly consistent (it is handed over whole)."""
        found = self._client.get_item(
            TableName=self.table, Key=release_key(lease.shard, tenant_id), ConsistentRead=True
        ).get("Item")
        item = from_dynamo(found) if found else {}
        return {k: int(v) for k, v in item.items() if k != "pk" and int(v) != 0}

    def hand_over_actions(
        self, lease: Lease, tenant_id: str, tally: dict[str, int]
    ) -> list[dict[str, Any]]:
        """Transaction actions emptying the tenant's tally (the caller adds the same amounts to
        the tenant's usage in the same transaction) and taking it off the pending set."""
        done = {
            "Update": {
                "TableName": self.table,
                "Key": shard_key(lease.shard),
                "UpdateExpression": f"DELETE {PENDING} :t",
                # Race: a holder taken over meanwhile; the new holder hands the tally over,
                # so exactly one transfer happens.
                "ConditionExpression": "fence = :fence",
                "ExpressionAttributeValues": values(fence=lease.fence)
                | {":t": {"SS": [tenant_id]}},
            }
        }
        if not tally:
            return [done]
        return [
            done,
            self.tally_release_action(lease, tenant_id, {k: -v for k, v in tally.items()}),
        ]

    def advance(self, lease: Lease, watermark: int, *, expires_at: int) -> bool:
        """Move the watermark forward and renew the lease; False when the lease was lost."""
        try:
            self._client.update_item(
                TableName=self.table,
                Key=shard_key(lease.shard),
                UpdateExpression="SET watermark = :w, expires_at = :until",
                # Race: a stale holder moving the watermark backwards (or at all) after a
                # takeover; only the current fence may move it, and only forward.
                ConditionExpression="fence = :fence AND watermark <= :w",
                ExpressionAttributeValues=values(fence=lease.fence, w=watermark, until=expires_at),
            )
        except ConditionFailed:
            return False
        return True

    def renew(self, lease: Lease, *, expires_at: int) -> bool:
        """Extend the lease (a long bucket); False when it was lost."""
        try:
            self._client.update_item(
                TableName=self.table,
                Key=shard_key(lease.shard),
                UpdateExpression="SET expires_at = :until",
                # Race: extending a lease another materializer has taken over meanwhile.
                ConditionExpression="fence = :fence",
                ExpressionAttributeValues=values(fence=lease.fence, until=expires_at),
            )
        except ConditionFailed:
            return False
        return True

    def release(self, lease: Lease, *, now: int) -> None:
        """End the lease early so the next tick need not wait for it to expire."""
        with suppress(ConditionFailed):
            self._client.update_item(
                TableName=self.table,
                Key=shard_key(lease.shard),
                UpdateExpression="SET expires_at = :now",
                # Race: releasing a lease another materializer has taken over meanwhile.
                ConditionExpression="fence = :fence",
                ExpressionAttributeValues=values(fence=lease.fence, now=now - 1),
            )

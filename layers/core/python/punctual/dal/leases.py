"""The leases table: one item per shard with its lease, fencing token and watermark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from punctual.dal.common import from_dynamo, to_dynamo, translated, values
from punctual.errors import Conflict


@dataclass(frozen=True, slots=True)
class Lease:
    shard: int
    holder: str
    fence: int  # grows by one with every claim: a later claim always has a larger token
    expires_at: int
    watermark: int  # the first minute bucket not yet fully processed (epoch seconds)


def shard_key(shard: int) -> dict[str, Any]:
    return to_dynamo({"pk": f"SHARD#{shard:04d}"})


class LeaseStore:
    def __init__(self, client: Any, table: str) -> None:
        self._client = client
        self.table = table

    def claim(self, shard: int, holder: str, *, now: int, ttl: int, start_at: int) -> Lease | None:
        """Take the shard's lease if it is free, expired or already ours; None if it is busy."""
        try:
            with translated():
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
        except Conflict:
            return None
        item = from_dynamo(answer["Attributes"])
        return Lease(shard, holder, item["fence"], item["expires_at"], item["watermark"])

    def still_mine(self, lease: Lease) -> dict[str, Any]:
        """A transaction action that fails once another materializer has claimed the shard."""
        return {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": shard_key(lease.shard),
                # Race: a holder that stalled past its lease (GC pause, slow network) and was
                # taken over must not commit anything afterwards: the fence has moved on.
                "ConditionExpression": "fence = :fence",
                "ExpressionAttributeValues": values(fence=lease.fence),
            }
        }

    def advance(self, lease: Lease, watermark: int) -> bool:
        """Move the watermark forward; False when the lease was lost (nothing written)."""
        try:
            with translated():
                self._client.update_item(
                    TableName=self.table,
                    Key=shard_key(lease.shard),
                    UpdateExpression="SET watermark = :w",
                    # Race: a stale holder moving the watermark backwards (or at all) after a
                    # takeover; only the current fence may move it, and only forward.
                    ConditionExpression="fence = :fence AND watermark <= :w",
                    ExpressionAttributeValues=values(fence=lease.fence, w=watermark),
                )
        except Conflict:
            return False
        return True

    def release(self, lease: Lease, *, now: int) -> None:
        """End the lease early so the next tick need not wait for it to expire."""
        try:
            with translated():
                self._client.update_item(
                    TableName=self.table,
                    Key=shard_key(lease.shard),
                    UpdateExpression="SET expires_at = :now",
                    # Race: releasing a lease another materializer has taken over meanwhile.
                    ConditionExpression="fence = :fence",
                    ExpressionAttributeValues=values(fence=lease.fence, now=now - 1),
                )
        except Conflict:
            pass

"""Idempotent business effects: record the effect keyed by occurrence_id in the tenant's
own DynamoDB table, in the same transaction as the effect's own writes. A re-delivery
(a lost ack, an expired lease, a relay resend) then cannot apply it twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from punctual.dal.common import ConditionFailed, Label, Transactions, dynamo, to_dynamo


class EffectLedger:
    def __init__(
        self,
        client: Any,
        table: str,
        *,
        key_attribute: str = "pk",
        ttl_attribute: str | None = "expires_at",
        keep_days: int = 35,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._client = dynamo(client)
        self.table = table
        self.key_attribute = key_attribute
        self.ttl_attribute = ttl_attribute
        self.keep_seconds = keep_days * 86400
        self._now = now

    def key(self, occurrence_id: str, effect: str) -> str:
        return f"effect#{effect}#{occurrence_id}"

    def record_action(self, occurrence_id: str, effect: str = "default") -> dict[str, Any]:
        """The TransactWriteItems action that records the effect, once."""
        now = int(self._now())
        item: dict[str, Any] = {
            self.key_attribute: self.key(occurrence_id, effect),
            "occurrence_id": occurrence_id,
            "effect": effect,
            "recorded_at": now,
        }
        if self.ttl_attribute:
            item[self.ttl_attribute] = now + self.keep_seconds
        return {
            "Put": {
                "TableName": self.table,
                "Item": to_dynamo(item),
                # Race: a second delivery of the same occurrence applying the effect again;
                # the first transaction to record it wins, the other changes nothing.
                "ConditionExpression": f"attribute_not_exists({self.key_attribute})",
            }
        }

    def apply(
        self, occurrence_id: str, writes: list[dict[str, Any]], effect: str = "default"
    ) -> bool:
        """Commit ``writes`` (TransactWriteItems actions, at most 99) with the record. True if
        they were applied now, False if this occurrence's effect was applied before; a failed
        condition of one of ``writes`` raises ConditionFailed (its label "write"), a
        conflicting transaction or throttling Retryable."""
        try:
            Transactions(self._client).commit(
                [
                    *((Label.EFFECT_WRITE, w) for w in writes),
                    (Label.EFFECT, self.record_action(occurrence_id, effect)),
                ]
            )
        except ConditionFailed as refused:
            if refused.failed(len(writes)):
                return False
            raise
        return True

    def applied(self, occurrence_id: str, effect: str = "default") -> bool:
        found = self._client.get_item(
            TableName=self.table,
            Key=to_dynamo({self.key_attribute: self.key(occurrence_id, effect)}),
            ConsistentRead=True,
        )
        return "Item" in found

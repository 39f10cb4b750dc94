"""The ledger table: the reconciler's pages of each tenant's hours (punctual.domain.ledger).

Key design: ``pk = <tenant>#<YYYYMMDD>`` (the tenant's day), ``sk = <hour>#<shard>`` (fixed
width, so a Query by sort key reads hours in order). A day per partition key spreads one
tenant's pages over partitions as time goes on, and a day's range is one Query. Only the
reconciler writes here and only the API reads: no tenant's role is granted the table, so
no tenant can write into another's pages (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from punctual.dal.common import BadItems, ConditionFailed, Item, dynamo, from_dynamo, to_dynamo
from punctual.dal.common import values as named_values
from punctual.domain.ids import occurrence_name
from punctual.domain.ledger import HOUR, LedgerEntry, LedgerPage

DAY = 86400
# The partition of the marks "this hour of this shard was checked" (no tenant id begins
# with "#"): what tells an hour with nothing of a tenant's from one not checked yet.
CHECKED = "#checked"


def ledger_pk(tenant_id: str, instant: int) -> str:
    return f"{tenant_id}#{datetime.fromtimestamp(instant, UTC):%Y%m%d}"


def ledger_sk(hour: int, shard: int) -> str:
    return f"{hour:012d}#{shard:05d}"


def _entry_row(entry: LedgerEntry) -> list[Any]:
    # A row, not a map: the attribute names would double a page's size (and its write units).
    return [
        entry.scheduled_for,
        entry.occurrence_id,
        entry.finding.value,
        entry.state.value if entry.state else None,
        entry.attempts,
        entry.target,
    ]


def _entry(row: list[Any]) -> LedgerEntry:
    scheduled_for, occurrence_id, finding, state, attempts, target = row
    return LedgerEntry(
        occurrence_id=occurrence_id,
        schedule_id=occurrence_name(occurrence_id)[0],
        scheduled_for=scheduled_for,
        finding=finding,
        state=state,
        attempts=attempts,
        target=target,
    )


def page_to_item(page: LedgerPage, purge_at: int) -> Item:
    return {
        "pk": ledger_pk(page.tenant_id, page.hour),
        "sk": ledger_sk(page.hour, page.shard),
        **page.model_dump(mode="json", exclude={"entries"}),
        "entries": json.dumps([_entry_row(e) for e in page.entries], separators=(",", ":")),
        "purge_at": purge_at,
    }


def page_from_item(item: Item) -> LedgerPage:
    rows = json.loads(item.get("entries") or "[]")
    fields = {k: v for k, v in item.items() if k not in ("entries", "pk", "sk", "purge_at")}
    return LedgerPage.model_validate({**fields, "entries": [_entry(row) for row in rows]})


class LedgerStore:
    def __init__(self, client: Any, table: str, bad: BadItems | None = None) -> None:
        self._client = dynamo(client)
        self.table = table
        self._bad = bad or BadItems()

    def put(self, page: LedgerPage, *, purge_at: int) -> bool:
        """False when a later check of the same tenant, hour and shard is already stored."""
        return self._put(page_to_item(page, purge_at))

    def put_checked(self, hour: int, shard: int, *, checked_at: int, purge_at: int) -> bool:
        """Mark the hour of the shard checked, its tenants' pages written (False: a later
        check marked it already)."""
        return self._put(
            {
                "pk": ledger_pk(CHECKED, hour),
                "sk": ledger_sk(hour, shard),
                "checked_at": checked_at,
                "purge_at": purge_at,
            }
        )

    def _put(self, item: Item) -> bool:
        try:
            self._client.put_item(
                TableName=self.table,
                Item=to_dynamo(item),
                # Race: a slow or retried check of the hour finishing after a later one (a
                # re-check of an hour left in flight) must not put back the older states.
                ConditionExpression="attribute_not_exists(pk) OR checked_at <= :checked_at",
                ExpressionAttributeValues=named_values(checked_at=item["checked_at"]),
            )
        except ConditionFailed:
            return False
        return True

    def checked(self, first_hour: int, last_hour: int) -> dict[int, dict[int, int]]:
        """Which shards' checks of the hours [first_hour, last_hour] wrote their pages:
        hour -> shard -> when. (Eventually consistent, as ``pages``.)"""
        found: dict[int, dict[int, int]] = {}
        for item in self._items(CHECKED, first_hour, last_hour):
            hour, shard = (int(part) for part in str(item["sk"]).split("#"))
            found.setdefault(hour, {})[shard] = int(item["checked_at"])
        return found

    def pages(self, tenant_id: str, first_hour: int, last_hour: int) -> Iterator[LedgerPage]:
        """The tenant's pages of the hours [first_hour, last_hour] (aligned), by hour then
        shard: one Query per day.

        Eventually consistent: a page written in the last second may be missing from the
        answer, which then shows its hour as not checked yet (or its previous check's); the
        next read shows it. Nothing acts on this read but a reader."""
        for item in self._items(tenant_id, first_hour, last_hour):
            try:
                yield page_from_item(item)
            except (ValidationError, ValueError, TypeError) as error:
                # (Only the reconciler writes here: an item an older or a newer version
                # wrote that this one cannot read is left out, counted.)
                self._bad.skip(self.table, item, error)

    def _items(self, owner: str, first_hour: int, last_hour: int) -> Iterator[Item]:
        day = first_hour - first_hour % DAY
        while day <= last_hour:
            low = ledger_sk(max(first_hour, day), 0)
            high = ledger_sk(min(last_hour, day + DAY - HOUR), 99999)
            pages = self._client.query_pages(
                TableName=self.table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                ExpressionAttributeValues=to_dynamo(
                    {":pk": ledger_pk(owner, day), ":low": low, ":high": high}
                ),
            )
            for answer in pages:
                yield from (from_dynamo(raw) for raw in answer.get("Items", []))
            day += DAY

"""The ledger table: the reconciler's pages of each tenant's hours (punctual.domain.ledger).

Key design: ``pk = <tenant>#<YYYYMMDD>`` (the tenant's day), ``sk = <hour>#<shard>`` (fixed
width, so a Query by sort key reads hours in order). A day per partition key spreads one
tenant's pages over partitions as time goes on, and a day's range is one Query. Only the
reconciler writes here and only the API reads: no tenant's role is granted the table, so
no tenant can write into another's pages (docs/security.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from punctual.dal.common import (
    BadItems,
    ConditionFailed,
    Item,
    batch_get,
    dynamo,
    from_dynamo,
    to_dynamo,
)
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


# The bytes a page's rows may take: what is past them is counted in ``unlisted`` (an item is
# at most 400 KB; LISTED_PER_PAGE rows of ids the reconciler reads stay far below this).
ROWS_BYTES = 300_000


def _entry_row(entry: LedgerEntry) -> list[Any]:
    # A row, not a map: the attribute names would double a page's size (and its write units).
    return [
        entry.scheduled_for,
        entry.occurrence_id,
        entry.finding.value,
        entry.state.value if entry.state else None,
        entry.attempts,
        entry.target,
        1 if entry.late else 0,
    ]


def _entry(row: list[Any]) -> LedgerEntry:
    scheduled_for, occurrence_id, finding, state, attempts, target, late = row
    return LedgerEntry(
        occurrence_id=occurrence_id,
        schedule_id=occurrence_name(occurrence_id)[0],
        scheduled_for=scheduled_for,
        finding=finding,
        state=state,
        attempts=attempts,
        target=target,
        late=bool(late),
    )


def _rows(page: LedgerPage) -> tuple[str, int]:
    """The page's rows as one JSON text within ROWS_BYTES, and how many were left out."""
    rows = [
        json.dumps(_entry_row(e), separators=(",", ":"), ensure_ascii=False) for e in page.entries
    ]
    kept, size = 0, 2
    for row in rows:
        size += len(row.encode()) + 1
        if size > ROWS_BYTES:
            break
        kept += 1
    return "[" + ",".join(rows[:kept]) + "]", len(rows) - kept


def page_to_item(page: LedgerPage, purge_at: int) -> Item:
    rows, left_out = _rows(page)
    item = {
        "pk": ledger_pk(page.tenant_id, page.hour),
        "sk": ledger_sk(page.hour, page.shard),
        **page.model_dump(mode="json", exclude={"entries"}),
        "unlisted": page.unlisted + left_out,
        "entries": rows,
        "purge_at": purge_at,
    }
    return item | {"digest": _digest(item)}


def _digest(item: Item) -> str:
    """What a page says (its counts and its rows; not when it was checked): a check that
    finds the same writes nothing."""
    said = {k: v for k, v in item.items() if k not in ("checked_at", "purge_at", "digest")}
    text = json.dumps(said, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


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

    def unchanged(self, pages: list[LedgerPage]) -> set[tuple[str, int]]:
        """Which of ``pages`` (tenant, shard) are stored saying the same already: a re-check
        of an hour left in flight finds most tenants' pages as they were, and a read is a
        quarter of a write's price.

        Eventually consistent: a replica a moment behind shows an older page, whose digest
        differs, and the page is written again (harmless); the same digest on an older page
        means the same content, and the write it saves would have changed nothing."""
        keys = {
            (p.tenant_id, p.shard): {
                "pk": ledger_pk(p.tenant_id, p.hour),
                "sk": ledger_sk(p.hour, p.shard),
            }
            for p in pages
        }
        found = batch_get(
            self._client, self.table, list(keys.values()), consistent=False, attributes=["digest"]
        )
        stored = {(str(i["pk"]), str(i["sk"])): i.get("digest") for i in found}
        return {
            (p.tenant_id, p.shard)
            for p in pages
            if stored.get((ledger_pk(p.tenant_id, p.hour), ledger_sk(p.hour, p.shard)))
            == page_to_item(p, 0)["digest"]
        }

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

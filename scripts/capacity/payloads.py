"""A schedule's payload and the schedules table: what one materializer step writes to the
due index's busiest key and to the CURRENT item, and what it reads, with the payload in the
CURRENT item (before 2026-12-06) and in the version item alone (now).

The items are the DAL's own (``schedule_to_item``, ``version_to_item``), sized by DynamoDB's
rules [item-size]: a write unit per KB of the item written (an index entry's too), a read
unit per 4 KB read (half of it eventually consistent), each rounded up per item (a Query
sums its page before rounding)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.schedules import PAYLOAD_MARK, schedule_to_item, version_to_item
from punctual.dal.tables import SHARD_INDEX_ATTRIBUTES
from punctual.domain.schedule import MAX_PAYLOAD_BYTES, Schedule
from punctual.domain.tenancy import strict_minute_load
from scripts.bench_materializer import item_size
from scripts.capacity.model import KB, RCU_BYTES, units

ITEM_SIZE = (
    "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html"
)
# The payloads shown: none, the bench's (100 bytes), 1 KB, and the largest the API takes.
SIZES = (0, 100, KB, MAX_PAYLOAD_BYTES)
_BY_SHARD = ("schedule_id", "sk", "shard", "created_key", *SHARD_INDEX_ATTRIBUTES)


def item_bytes(item: Mapping[str, Any]) -> int:
    """An item's size (DynamoDB's JSON) by DynamoDB's rules [item-size]: each attribute's
    name and its value's size (``bench_materializer.item_size``: a number one byte per two
    significant digits and one more, a map or list 3 bytes and one per element besides its
    elements)."""
    return sum(len(name.encode()) + item_size(value) for name, value in from_dynamo(item).items())


def sample(payload: int) -> Schedule:
    """An hourly cron in a zone (the :00 peak's shape), with a payload of ``payload`` bytes
    of JSON (none when 0)."""
    moment = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)
    body = {"data": "x" * (payload - len('{"data":""}'))} if payload else {}
    return Schedule.model_validate(
        {
            "name": "nightly report",
            "spec": {"kind": "cron", "expression": "0 * * * *", "timezone": "Europe/Berlin"},
            "target": "default",
            "payload": body,
            "tenant_id": "acme",
            "schedule_id": "sch_acme.k3xq7fz2m9a4tw8bn6c5pd1e",
            "version": 3,
            "created_at": moment,
            "updated_at": moment,
            "planned_until": 1_796_000_399,
            "next_run_at": 1_796_000_400,
            "next_available_at": 1_796_000_400,
            "home_region": "us-east-1",
        }
    )


def current_item(schedule: Schedule, *, legacy: bool = False) -> dict[str, Any]:
    """The CURRENT item (DynamoDB's JSON); ``legacy``: as written before 2026-12-06, the
    payload in its definition."""
    load = strict_minute_load(schedule, schedule.created_at)
    item = schedule_to_item(schedule, shard=7, minute_load=load)
    if legacy:
        definition = dict(item["definition"])
        definition.pop(PAYLOAD_MARK, None)
        item["definition"] = definition | {"payload": schedule.known_payload}
    return to_dynamo(item)


@dataclass(frozen=True)
class PayloadRow:
    """One payload size: item sizes in bytes, a step's units, before and now."""

    payload: int
    current_before: int  # the CURRENT item = the due index entry (ALL)
    current_after: int
    shard_before: int  # its by_shard index entry (INCLUDE: ``definition`` among them)
    shard_after: int
    version: int  # the version item (the payload's only copy now)

    @staticmethod
    def index_units(size: int) -> int:
        """Write units of one due index write (the entry leaving or entering a key)."""
        return units(size)

    def cursor_units(self, size: int) -> int:
        """The step's transactional cursor update of the CURRENT item (2 a KB)."""
        return 2 * units(size)

    @staticmethod
    def query_read_units(size: int) -> float:
        """The materializer's due index Query, per schedule: the page's bytes / 4 KB,
        eventually consistent (halved)."""
        return size / RCU_BYTES / 2

    @property
    def payload_read_units(self) -> float:
        """The read of the version item a step with a payload now makes (BatchGetItem,
        eventually consistent): its size / 4 KB rounded up, halved; none without a
        payload."""
        return math.ceil(self.version / RCU_BYTES) / 2 if self.payload else 0.0


def payload_rows(sizes: Sequence[int] = SIZES) -> list[PayloadRow]:
    rows = []
    for payload in sizes:
        schedule = sample(payload)
        before, after = current_item(schedule, legacy=True), current_item(schedule)
        rows.append(
            PayloadRow(
                payload=payload,
                current_before=item_bytes(before),
                current_after=item_bytes(after),
                shard_before=item_bytes({k: v for k, v in before.items() if k in _BY_SHARD}),
                shard_after=item_bytes({k: v for k, v in after.items() if k in _BY_SHARD}),
                version=item_bytes(to_dynamo(version_to_item(schedule, 1_796_000_000))),
            )
        )
    return rows

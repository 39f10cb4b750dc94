"""Materializer throughput on DynamoDB Local: N strict schedules due in one minute.

Prints occurrences materialized per second per shard (Q: one materializer on one
shard, as one Map iteration runs it), DynamoDB write units per occurrence from
the item sizes and the pricing rules, and the shard count the peak would need.
Run: ``make bench-materializer`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.schedules import schedule_to_item, version_to_item
from punctual.dal.tables import SCHEDULE_CURRENT, create_tables, occurrence_key
from punctual.dal.tenants import tenant_to_item
from punctual.domain.ids import new_schedule_id, shard_of
from punctual.domain.schedule import Schedule
from punctual.domain.tenancy import Quotas, Tenant
from punctual.pipeline.materializer import Materializer
from punctual.services import COLLECTOR, Services
from punctual.settings import Settings
from punctual_local.dynamodb import start

TENANTS = ("acme", "globex", "initech", "umbrella")
PEAK_PER_SECOND = 100_000  # 500,000 strict fires within 5 s, met head on
SPREAD_PER_SECOND = math.ceil(500_000 / 60)  # the same fires pre-materialized over a minute


def item_size(value: Any) -> int:
    """DynamoDB's item size rules, closely enough to count write units."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, int | float | Decimal):
        digits = len(str(abs(Decimal(str(value)))).replace(".", "").lstrip("0")) or 1
        return math.ceil(digits / 2) + 1
    if isinstance(value, dict):
        return 3 + sum(len(k.encode()) + 1 + item_size(v) for k, v in value.items())
    if isinstance(value, list):
        return 3 + sum(1 + item_size(v) for v in value)
    raise TypeError(type(value))


def units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def seed(
    services: Services, count: int, due: int, payload_bytes: int, expression: str = "0 * * * *"
) -> list[str]:
    """``count`` strict cron schedules whose next fire is ``due`` (a fire of ``expression``)."""
    client, settings = services.dynamodb, services.settings
    created = datetime.fromtimestamp(due - 86400, UTC)
    for tenant in TENANTS:
        quotas = Quotas(max_schedules=10**7, max_strict_fires_per_minute=10**6)
        tenant_item = tenant_to_item(Tenant(tenant_id=tenant, quotas=quotas, created_at=created))
        client.put_item(TableName=settings.tenants_table, Item=to_dynamo(tenant_item))
    ids: list[str] = []
    batch: list[dict[str, Any]] = []
    for n in range(count):
        owner = TENANTS[n % len(TENANTS)]
        schedule = Schedule.model_validate(
            {
                "tenant_id": owner,
                "schedule_id": new_schedule_id(owner),
                "version": 1,
                "spec": {"kind": "cron", "expression": expression, "timezone": "UTC"},
                "target": "default",
                "payload": {"job": "x" * payload_bytes},
                "created_at": created,
                "updated_at": created,
                "next_run_at": due,
                "next_available_at": due,
            }
        )
        ids.append(schedule.schedule_id)
        shard = shard_of(schedule.schedule_id, settings.shard_count)
        item = schedule_to_item(schedule, shard=shard, minute_load={0: 1})
        # (Its version item too: the payload is kept there alone, and the step reads it.)
        version = version_to_item(schedule, effective_from=int(created.timestamp()))
        batch += [{"PutRequest": {"Item": to_dynamo(i)}} for i in (item, version)]
        if len(batch) >= 24:  # (BatchWriteItem takes 25 items at most)
            client.batch_write_item(RequestItems={settings.schedules_table: batch})
            batch = []
    if batch:
        client.batch_write_item(RequestItems={settings.schedules_table: batch})
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--payload-bytes", type=int, default=100)
    args = parser.parse_args()

    engine = start()
    try:
        settings = Settings(shard_count=args.shards)
        due = int(datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp())
        services = Services(
            dynamodb=engine.client(), sqs=None, settings=settings, now=lambda: due - 120
        )
        create_tables(services.dynamodb, settings)
        started = time.perf_counter()
        ids = seed(services, args.schedules, due, args.payload_bytes)
        print(
            f"seeded {len(ids):,} schedules in {time.perf_counter() - started:.1f} s "
            f"({args.shards} shards, DynamoDB Local at {engine.endpoint})"
        )
        before = from_dynamo(
            services.dynamodb.get_item(
                TableName=settings.schedules_table,
                Key=to_dynamo({"schedule_id": ids[0], "sk": SCHEDULE_CURRENT}),
            )["Item"]
        )

        rates, total, elapsed = [], 0, 0.0
        for shard in range(args.shards):
            materializer = Materializer(services, f"bench-{shard}")
            started = time.perf_counter()
            with COLLECTOR.tuned():  # as the handler runs it
                report = materializer.run_shard(due - 120, shard)
            seconds = time.perf_counter() - started
            total += report.occurrences
            elapsed += seconds
            if report.occurrences:
                rates.append(report.occurrences / seconds)
        q = statistics.median(rates)
        print(f"materialized {total:,} occurrences in {elapsed:.1f} s of shard work")
        print(
            f"Q (per shard, one materializer): median {q:,.0f}/s, "
            f"min {min(rates):,.0f}/s, max {max(rates):,.0f}/s"
        )

        occurrence = services.occurrences.list_for_schedule(
            ids[0], since=0, until=2**40, limit=1, token=None
        )[0][0]
        occ_item = services.dynamodb.get_item(
            TableName=settings.occurrences_table,
            Key=to_dynamo(occurrence_key(occurrence.occurrence_id)),
        )["Item"]
        occ_size = item_size(from_dynamo(occ_item))
        sched_size = item_size(before)
        per_tx = (100 - 1) // 2  # schedules per transaction: 2 actions each, 1 fence check
        costs = {
            "occurrence put (transactional: 2 per KB)": 2 * units(occ_size),
            "cursor update (transactional: 2 per KB)": 2 * units(sched_size),
            "due index: key moves (delete + put)": 2 * units(sched_size),
            f"fence check (2 per transaction of {per_tx})": 2 / per_tx,
        }
        print(f"item sizes: occurrence {occ_size} B, schedule {sched_size} B")
        for what, cost in costs.items():
            print(f"  {cost:6.2f} WCU  {what}")
        wcu = sum(costs.values())
        print(
            f"write units per occurrence, materialize step: {wcu:.2f} "
            "(the relay writes nothing back)"
        )
        print(
            f"shards walked at once for {PEAK_PER_SECOND:,}/s head on: "
            f"ceil({PEAK_PER_SECOND:,} / {q:,.0f}) = {math.ceil(PEAK_PER_SECOND / q)}"
        )
        print(
            f"shards walked at once with a one-minute lookahead ({SPREAD_PER_SECOND:,}/s): "
            f"{math.ceil(SPREAD_PER_SECOND / q)} (one per shard group: a group walks its shards "
            "in turn; `make capacity` simulates the peak with the rest of the minute's work)"
        )
    finally:
        engine.stop()


if __name__ == "__main__":
    main()

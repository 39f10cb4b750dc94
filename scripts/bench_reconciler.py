"""What the hourly reconciler costs per schedule-hour, on DynamoDB Local (issue 21).

Seeds N cron schedules as the seed's workload mixes them (a third hourly, the rest daily at
every hour of the day, so about 10 fires a schedule a day), lets the materializer make an
hour of their occurrences, then reconciles that hour shard by shard as the hourly run does.
Prints the read units it used (from the sizes of the items each call returned, DynamoDB's
rounding: 4 KB a unit, half for an eventually consistent read) and its CPU, per schedule,
next to what `make capacity` prices (CostInputs), and what it
found (nothing should be missing). Run: ``make bench-reconciler`` (``BENCH_ARGS='--schedules
3000'``).
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import UTC, datetime
from typing import Any

from punctual.clients import aws_client
from punctual.dal.common import from_dynamo
from punctual.dal.tables import create_tables
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from punctual.settings import Settings
from punctual_local.dynamodb import start
from scripts.bench_materializer import item_size, seed
from scripts.capacity.cost import RECONCILE_CPU, RECONCILE_READS

# What `make capacity` prices.
ASSUMED_READS = RECONCILE_READS
ASSUMED_CPU_MS = RECONCILE_CPU * 1000
SHARDS = 4


class ReadMeter:
    """A DynamoDB client that counts the read units of what it returns."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.units = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)
        if name == "get_paginator":
            return lambda operation: _MeteredPaginator(self, operation, call(operation))
        if name not in ("query", "get_item", "batch_get_item", "scan"):
            return call

        def metered(**request: Any) -> Any:
            answer = call(**request)
            self.calls += 1
            self.units += _units(name, request, answer)
            return answer

        return metered


class _MeteredPaginator:
    def __init__(self, meter: ReadMeter, operation: str, paginator: Any) -> None:
        self._meter, self._operation, self._paginator = meter, operation, paginator

    def paginate(self, **request: Any) -> Any:
        for page in self._paginator.paginate(**request):
            self._meter.calls += 1
            self._meter.units += _units(self._operation, request, page)
            yield page


def _units(name: str, request: dict[str, Any], answer: dict[str, Any]) -> float:
    if name == "batch_get_item":
        total = 0.0
        for table, items in answer.get("Responses", {}).items():
            strong = request["RequestItems"][table].get("ConsistentRead", False)
            for item in items:
                total += math.ceil(max(1, item_size(from_dynamo(item))) / 4096) * (
                    1 if strong else 0.5
                )
        return total
    factor = 1 if request.get("ConsistentRead", False) else 0.5
    items = answer.get("Items", [answer["Item"]] if "Item" in answer else [])
    size = sum(item_size(from_dynamo(item)) for item in items)
    # A Query or Scan rounds the whole page up once; a GetItem its item (at least 1 unit).
    return max(1, math.ceil(size / 4096)) * factor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=2400)
    args = parser.parse_args()
    engine = start()
    try:
        # As the Lambda's client is (punctual.clients.aws_client).
        client = aws_client(
            "dynamodb",
            endpoint_url=engine.endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        run(client, args.schedules)
    finally:
        engine.stop()


def run(client: Any, count: int) -> None:
    start_at = int(datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp())
    end_at = start_at + 3600
    clock = [start_at - 600.0]
    settings = Settings(shard_count=SHARDS)
    services = Services(dynamodb=client, sqs=None, settings=settings, now=lambda: clock[0])
    create_tables(client, settings)
    # Each shard's watermark first (as bench_pipeline does), then the schedules behind it.
    warm = Services(
        client, None, settings.model_copy(update={"lookahead_seconds": 0}), services.now
    )
    Materializer(warm, "bench").run(int(clock[0]), list(range(SHARDS)))
    hourly = count // 3
    ids = seed(services, hourly, start_at, 100, "0 * * * *")
    for hour in range(24):
        due = start_at + ((hour - 12) % 24) * 3600 + 1800  # the next HH:30 from 12:00
        ids += seed(services, (count - hourly) // 24, due, 100, f"30 {hour} * * *")
    # The healthy materializer through the hour (and its lookahead), a tick a minute.
    while clock[0] <= end_at + 300:
        Materializer(services, f"m{clock[0]}").run(int(clock[0]), list(range(SHARDS)))
        clock[0] += 60
    clock[0] = end_at + 20 * 60  # the hourly run starts at :20 past the next hour
    # Twice (it only reads): metered for its read units, then bare for its CPU.
    meter = ReadMeter(client)
    metered = Services(dynamodb=meter, sqs=None, settings=settings, now=lambda: clock[0])
    Reconciler(metered, repair=False).run(list(range(SHARDS)), start_at, end_at)
    cpu = time.process_time()
    started = time.perf_counter()
    results = Reconciler(services, repair=False).run(list(range(SHARDS)), start_at, end_at)
    cpu = time.process_time() - cpu
    seconds = time.perf_counter() - started
    checked = sum(r.report.schedules for r in results)
    missing = sum(len(r.missing) for r in results)
    unexpected = sum(len(r.unexpected) for r in results)
    print(
        f"{len(ids):,} schedules ({hourly:,} hourly, the rest daily at every hour), "
        f"{SHARDS} shards; the hour {datetime.fromtimestamp(start_at, UTC):%H:%M}Z reconciled "
        f"in {seconds:.1f} s: {checked:,} schedules checked, {missing} missing, "
        f"{unexpected} unexpected"
    )
    per = max(1, len(ids))
    print(
        f"  read units per schedule-hour: {meter.units / per:.3f} "
        f"(make capacity prices {ASSUMED_READS}; {meter.calls / per:.2f} calls a schedule)"
    )
    print(
        f"  CPU per schedule-hour: {cpu / per * 1000:.3f} ms (make capacity prices "
        f"{ASSUMED_CPU_MS:.1f} ms at 1,769 MB)"
    )


if __name__ == "__main__":
    main()

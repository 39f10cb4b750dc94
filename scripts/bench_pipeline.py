"""The whole local pipeline under a top-of-minute burst: N strict schedules (several
tenants) due in the same minute -> materializer (shard groups in parallel, as the Map
runs them) -> the occurrences stream -> relay -> per-tenant SQS queues.

Engines as `make run` uses them: DynamoDB Local and moto's SQS server (with the
attribute fix), each in its own process. Prints schedule_lag p50/p95/p99 (when the
message became receivable in its queue minus scheduled_for), occurrences per second
through each stage, DynamoDB write units and SQS requests per occurrence, and the cost
per million occurrences at public us-east-1 prices.
Run: ``make bench`` (options: ``BENCH_ARGS='--schedules 5000'``; ``--help``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from punctual.clients import aws_client
from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import SCHEDULE_CURRENT, create_tables, occurrence_key
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.relay import Relay
from punctual.services import COLLECTOR, Services
from punctual.settings import Settings
from punctual_local.engines import ensure_engines
from punctual_local.stack import StackOptions, configure_environment
from punctual_local.stats import percentile
from punctual_local.streams import StreamPoller
from scripts.bench_materializer import TENANTS, item_size, seed, units

# us-east-1 public prices (USD), checked 2026-11: DynamoDB on-demand, SQS standard,
# Lambda arm64, Step Functions Express.
PRICE_WRITE_UNIT = 0.625 / 1e6
PRICE_READ_UNIT = 0.125 / 1e6
PRICE_SQS_REQUEST = 0.40 / 1e6
PRICE_LAMBDA_REQUEST = 0.20 / 1e6
PRICE_LAMBDA_GB_SECOND = 0.0000133334
PRICE_EXPRESS_REQUEST = 1.00 / 1e6
LAMBDA_GB = 1.0  # the materializer's and relay's memory (infra/)
RELAY_BATCH = 500
WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
READS = ("get_item", "query", "batch_get_item", "scan")
STREAM_READS = ("describe_stream", "get_shard_iterator", "get_records")


@dataclass
class Meter:
    """Counts what the pipeline asks of DynamoDB and SQS."""

    calls: Counter[str] = field(default_factory=Counter)
    items: Counter[str] = field(default_factory=Counter)  # "<op>:<table>[:tx]"
    # CPU spent inside the AWS clients (building, signing, sending, parsing; each thread's
    # own CPU, waits excluded): what of our processes' CPU is boto3's, not our code's.
    client_cpu: float = 0.0
    cpu_by_call: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spent(self, seconds: float, op: str) -> None:
        with self.lock:
            self.client_cpu += seconds
            self.cpu_by_call[op] += seconds

    def note(self, op: str, request: dict[str, Any]) -> None:
        with self.lock:
            self.calls[op] += 1
            if op == "transact_write_items":
                for action in request["TransactItems"]:
                    (kind, body), *_ = action.items()
                    self.items[f"{kind}:{body['TableName']}:tx"] += 1
            elif op in ("put_item", "update_item", "delete_item"):
                self.items[f"{op}:{request['TableName']}"] += 1
            elif op == "send_message_batch":
                self.items["sqs_messages"] += len(request["Entries"])


class Metered:
    def __init__(self, client: Any, meter: Meter) -> None:
        self._client = client
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or name.startswith("get_paginator"):
            return attribute

        def call(**request: Any) -> Any:
            self._meter.note(name, request)
            cpu = time.thread_time()
            try:
                return attribute(**request)
            finally:
                self._meter.spent(time.thread_time() - cpu, name)

        return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--consumers", type=int, default=4, help="receive threads per queue")
    parser.add_argument(
        "--python-collector",
        action="store_true",
        help="materialize with Python's garbage collector thresholds (the materializer's "
        "handler raises them: punctual.services.Collector), to compare",
    )
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="punctual-bench-"))
    engines = ensure_engines(data, in_memory=True)
    try:
        configure_environment(engines, StackOptions(data=data, lookahead_seconds=600))
        run(args, engines.dynamodb.endpoint)
    finally:
        engines.stop()


@dataclass(frozen=True)
class Stage:
    """What one stage of the pipeline took: wall-clock seconds, the process's CPU seconds,
    and the part of that CPU spent inside the AWS clients."""

    seconds: float
    cpu: float
    in_clients: float


def run(args: argparse.Namespace, endpoint: str) -> None:
    meter = Meter()
    settings = Settings()
    plain = Services(aws_client("dynamodb"), aws_client("sqs"), settings, time.time)
    create_tables(plain.dynamodb, settings)
    groups = [
        list(range(s, min(s + 2, settings.shard_count))) for s in range(0, settings.shard_count, 2)
    ]
    warm_up(plain)
    # Due at a minute boundary far enough ahead to seed, materialize and relay first
    # (about 300 schedules/s for each on this machine, in memory), as the lookahead does.
    due = (int(time.time()) + 30 + args.schedules // 100) // 60 * 60 + 60
    ids, queues = seed_burst(plain, args, due, endpoint)
    services = Services(
        Metered(plain.dynamodb, meter), Metered(plain.sqs, meter), settings, time.time
    )
    reports, materialized = materialize(services, meter, groups, args.python_collector)
    made = sum(r.occurrences for r in reports)
    if made != len(ids):
        raise SystemExit(f"expected {len(ids)} occurrences, materialized {made}: {reports}")
    sent, relayed, stream_reads = relay_all(plain, services, meter, made)
    if time.time() > due:
        print("WARNING: the relay finished after the due instant; lags include the backlog")
    received = receive(plain.sqs, list(queues.values()), args.consumers, made, due)
    report_lags(received, made)
    report_cpu(sum(r.schedules for r in reports), materialized, sent, relayed, stream_reads)
    batches = meter.calls["send_message_batch"]
    print(
        f"SQS: {meter.items['sqs_messages'] / batches:.2f} messages per SendMessageBatch "
        f"({batches:,} calls; 10 at most)"
    )
    report_costs(plain, meter, made, ids[0], materialized.cpu, relayed.cpu, len(groups))


def warm_up(plain: Services) -> None:
    """The first tick walks an hour of empty buckets to set each shard's watermark; in
    service that happens once, so it is not measured. (Only up to now: seeding behind the
    API's back must not land in walked buckets.)"""
    settings = plain.settings
    warm = Services(
        plain.dynamodb, plain.sqs, settings.model_copy(update={"lookahead_seconds": 0}), time.time
    )
    Materializer(warm, "bench").run(int(time.time()), list(range(settings.shard_count)))


def seed_burst(
    plain: Services, args: argparse.Namespace, due: int, endpoint: str
) -> tuple[list[str], dict[str, str]]:
    """The strict schedules, a daily cron at exactly the due minute each (its next fire is
    ``due``), and a target per tenant: the schedules' ids, and each tenant's queue URL."""
    started = time.perf_counter()
    at = time.gmtime(due)
    daily = f"{at.tm_min} {at.tm_hour} * * *"
    ids = seed(plain, args.schedules, due, args.payload_bytes, daily)
    plane = ControlPlane(plain)
    queues = {t: plane.create_target(t, "default").queue_url for t in TENANTS}
    print(
        f"seeded {len(ids):,} strict schedules of {len(TENANTS)} tenants due at "
        f"{time.strftime('%H:%M:%S', time.gmtime(due))}Z in "
        f"{time.perf_counter() - started:.1f} s (DynamoDB Local at {endpoint})"
    )
    return ids, queues


def materialize(
    services: Services, meter: Meter, groups: list[list[int]], python_collector: bool
) -> tuple[list[Any], Stage]:
    """One call per shard group, in parallel, as the Step Functions Map does: the shards'
    reports, and what it took."""
    cpu, in_clients = time.process_time(), meter.client_cpu
    started = time.perf_counter()

    def invocation(shards: list[int]) -> list[Any]:
        # As the handler runs it: the collector tuned for the invocation, unless compared
        with nullcontext() if python_collector else COLLECTOR.tuned():
            return Materializer(services, "bench").run(int(time.time()), shards)

    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        reports = [r for part in pool.map(invocation, groups) for r in part]
    stage = Stage(
        time.perf_counter() - started, time.process_time() - cpu, meter.client_cpu - in_clients
    )
    made = sum(r.occurrences for r in reports)
    print(
        f"materialize: {made:,} occurrences in {stage.seconds:.1f} s "
        f"({made / stage.seconds:,.0f}/s, {len(groups)} groups of shards in parallel)"
    )
    return reports, stage


def relay_all(
    plain: Services, services: Services, meter: Meter, made: int
) -> tuple[int, Stage, float]:
    """The stream poller hands INSERT batches to the relay, as the mapping does, until the
    ``made`` occurrences are sent (or 10 minutes pass): how many were sent, what it took, and
    the CPU of the stream's reads (the bench reads the stream itself; on AWS the event source
    mapping does, outside the relay's Lambda, which gets the records as its event)."""
    relay = Relay(services)
    sent = 0

    def relay_batch(event: dict[str, Any]) -> dict[str, Any]:
        nonlocal sent
        report = relay.relay(event["Records"])
        sent += report.sent
        return {"batchItemFailures": [{"itemIdentifier": k} for k in report.failures]}

    poller = StreamPoller(
        plain.dynamodb,
        Metered(aws_client("dynamodbstreams"), meter),
        plain.settings.occurrences_table,
        relay_batch,
        Path(tempfile.mkdtemp()) / "streams.json",
    )
    cpu, in_clients = time.process_time(), meter.client_cpu
    in_streams = sum(meter.cpu_by_call[op] for op in STREAM_READS)
    started = time.perf_counter()
    while sent < made and time.perf_counter() - started < 600:
        poller.poll_once()
    stage = Stage(
        time.perf_counter() - started, time.process_time() - cpu, meter.client_cpu - in_clients
    )
    stream_reads = sum(meter.cpu_by_call[op] for op in STREAM_READS) - in_streams
    print(f"relay: {sent:,} messages sent in {stage.seconds:.1f} s ({sent / stage.seconds:,.0f}/s)")
    return sent, stage, stream_reads


def receive(
    sqs: Any, queues: list[str], consumers: int, made: int, due: int
) -> list[tuple[str, float, float, float]]:
    """What ``consumers`` threads per queue receive from just before the due instant until
    every occurrence came (or 2 minutes after it): (occurrence_id, scheduled_for,
    receivable, received) each, redeliveries included."""
    received: list[tuple[str, float, float, float]] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=consume, args=(sqs, url, received, stop), daemon=True)
        for url in queues
        for _ in range(consumers)
    ]
    # Consumers start just before the instant: moto's receive scans every message of the
    # queue per call, and polling all along would slow the sends being measured.
    time.sleep(max(0.0, due - 5 - time.time()))
    for thread in threads:
        thread.start()
    deadline = due + 120
    # Unique ids: moto redelivers some messages (visibility expiry) before their delete.
    while len({entry[0] for entry in received}) < made and time.time() < deadline:
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    return received


def report_cpu(
    steps: int, materialized: Stage, sent: int, relayed: Stage, stream_reads: float
) -> None:
    def ms(seconds: float, count: int) -> str:
        return f"{seconds / count * 1000:.3f} ms"

    ours = materialized.cpu - materialized.in_clients
    relay_ours = relayed.cpu - relayed.in_clients
    print(
        "CPU (issue 21's goals: <= 0.2 ms a step, <= 0.1 ms a record), total = our code + "
        "inside the AWS clients:\n"
        f"  per schedule step ({steps:,}): {ms(materialized.cpu, steps)} = "
        f"{ms(ours, steps)} + {ms(materialized.in_clients, steps)}"
        f"\n  per relayed record ({sent:,}, the stream's reads included): "
        f"{ms(relayed.cpu, sent)} = {ms(relay_ours, sent)} + "
        f"{ms(relayed.in_clients, sent)}; without the stream's reads (on AWS, the mapping's): "
        f"{ms(relayed.cpu - stream_reads, sent)} = {ms(relay_ours, sent)} + "
        f"{ms(relayed.in_clients - stream_reads, sent)}"
    )


def consume(
    sqs: Any, url: str, received: list[tuple[str, float, float, float]], stop: threading.Event
) -> None:
    while not stop.is_set():
        batch = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["SentTimestamp"],
        ).get("Messages", [])
        now = time.time()
        for message in batch:
            body = json.loads(message["Body"])
            scheduled = _epoch(body["scheduled_for"])
            available = _epoch(body["available_at"])
            sent_at = int(message["Attributes"]["SentTimestamp"]) / 1000
            # The relay sent it with DelaySeconds = ceil(available_at - now).
            receivable = sent_at + max(0, math.ceil(available - sent_at))
            received.append((body["occurrence_id"], scheduled, receivable, now))
        if batch:
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
                ],
            )


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def report_lags(received: list[tuple[str, float, float, float]], made: int) -> None:
    first: dict[str, tuple[str, float, float, float]] = {}
    for entry in sorted(received, key=lambda e: e[3]):
        first.setdefault(entry[0], entry)  # a redelivery counts once, when first received
    duplicates = len(received) - len(first)
    received = list(first.values())
    if len(received) < made:
        print(f"WARNING: only {len(received):,} of {made:,} occurrences were received")
    if not received:
        return
    receivable = [r - s for _, s, r, _ in received]
    observed = [got - s for _, s, _, got in received]
    for label, lags in (
        ("receivable", receivable),
        ("received by the bench's consumers", observed),
    ):
        print(
            f"schedule_lag ({label}): p50 {percentile(lags, 50):.2f} s, "
            f"p95 {percentile(lags, 95):.2f} s, p99 {percentile(lags, 99):.2f} s, "
            f"max {max(lags):.2f} s"
        )
    start = min(got for *_, got in received)
    end = max(got for *_, got in received)
    print(
        f"consume: {len(received):,} received in {end - start:.1f} s after the first "
        f"({duplicates} redeliveries to the bench's consumers not counted)"
    )


def report_costs(
    plain: Services,
    meter: Meter,
    made: int,
    schedule_id: str,
    materialize_cpu: float,
    relay_cpu: float,
    invocations: int,
) -> None:
    settings = plain.settings
    schedule_item = from_dynamo(
        plain.dynamodb.get_item(
            TableName=settings.schedules_table,
            Key=to_dynamo({"schedule_id": schedule_id, "sk": SCHEDULE_CURRENT}),
        )["Item"]
    )
    occurrence = plain.occurrences.list_for_schedule(
        schedule_id, since=0, until=2**40, limit=1, token=None
    )[0][0]
    occurrence_item = from_dynamo(
        plain.dynamodb.get_item(
            TableName=settings.occurrences_table,
            Key=to_dynamo(occurrence_key(occurrence.occurrence_id)),
        )["Item"]
    )
    occ_units, sched_units = units(item_size(occurrence_item)), units(item_size(schedule_item))
    # Write units from the counted writes and the item sizes: 2 per KB inside a
    # transaction. Indexes (punctual/dal/tables.py): `due` (ALL) moves its key on every
    # cursor step (delete + put); `by_tenant` projects only `state` and `by_shard` only
    # stable attributes, so a step writes neither. The occurrences table has no index.
    wcu = Counter[str]()
    for key, count in meter.items.items():
        op, table, *tx = [*key.split(":"), ""]
        if op == "sqs_messages":
            continue
        factor = 2 if tx and tx[0] == "tx" else 1
        if table == settings.occurrences_table and op in ("Put", "put_item"):
            wcu["occurrence insert"] += count * factor * occ_units
        elif table == settings.occurrences_table and op in ("Update", "update_item"):
            wcu["occurrence state change (relay: DEAD, unsendable)"] += count * factor * occ_units
        elif table == settings.schedules_table and op in ("Update", "update_item"):
            wcu["cursor update (+ due index key move)"] += count * (
                factor * sched_units + 2 * sched_units
            )
        elif op == "ConditionCheck":
            wcu["lease fence checks"] += count * factor
        else:
            wcu[f"{op} {table.removeprefix('punctual-')}"] += count * factor
    total_wcu = sum(wcu.values())
    print(
        f"item sizes: occurrence {item_size(occurrence_item)} B, "
        f"schedule {item_size(schedule_item)} B"
    )
    print("DynamoDB write units per occurrence (scheduler path: materialize -> queue):")
    for what, value in sorted(wcu.items(), key=lambda kv: -kv[1]):
        print(f"  {value / made:6.2f}  {what}")
    print(f"  {total_wcu / made:6.2f}  total")
    reads = sum(meter.calls[op] for op in READS)
    sqs_requests = meter.calls["send_message_batch"] + meter.calls["send_message"]
    print(
        f"calls per occurrence: DynamoDB reads {reads / made:.3f} (requests), "
        f"SQS {sqs_requests / made:.3f} (SendMessageBatch; the consumer's receive and delete "
        "are the worker's, not the scheduler's)"
    )
    cpu_per_occurrence = (materialize_cpu + relay_cpu) / made
    # Reads: each BatchGetItem/Query returns small items; 0.5 unit per eventually
    # consistent 4 KB read, counted per request as an upper bound of 1 unit.
    read_units = reads * 1.0
    # One materializer invocation per shard group per tick; one relay invocation per batch.
    lambda_requests = invocations / made + 1 / RELAY_BATCH
    cost = {
        "DynamoDB writes": total_wcu / made * PRICE_WRITE_UNIT,
        "DynamoDB reads": read_units / made * PRICE_READ_UNIT,
        "SQS requests": sqs_requests / made * PRICE_SQS_REQUEST,
        "Lambda GB-seconds (our CPU time, 1 GB)": cpu_per_occurrence
        * LAMBDA_GB
        * PRICE_LAMBDA_GB_SECOND,
        "Lambda requests": lambda_requests * PRICE_LAMBDA_REQUEST,
        "Step Functions Express (1 execution per tick)": PRICE_EXPRESS_REQUEST / made,
    }
    print(f"CPU time of our code per occurrence: {cpu_per_occurrence * 1000:.2f} ms")
    print("cost per million occurrences (us-east-1 on-demand list prices):")
    for what, dollars in cost.items():
        print(f"  ${dollars * 1e6:8.3f}  {what}")
    print(f"  ${sum(cost.values()) * 1e6:8.3f}  total (EventBridge Scheduler: $1.00)")


if __name__ == "__main__":
    main()

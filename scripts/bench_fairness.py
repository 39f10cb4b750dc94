"""Catch-up fairness (issue 22): does one tenant's catch-up of 100,000 occurrences move
another tenant's strict lag?

Through the real relay code on the local engines (DynamoDB Local and its stream, the SQS
engine), three runs, each on fresh engines:

1. **alone**: tenant ``steady``'s strict occurrences only, each written ``--slack`` seconds
   before its time (as a fire the API plans a moment ahead, or the materializer right after
   an outage), ``--strict-per-second`` of them;
2. **one lane** (before the lanes existed): tenant ``flood``'s ``--catchup`` catch-up
   occurrences (late fires released from now and paced over 840 s, as a catch-up compressed
   into SQS's delay is) are written as fast as DynamoDB Local takes them (four writers) while
   the steady tenant's strict fires arrive as in run 1, until the catch-up is sent; one
   poller relays the stream: the strict records queue behind the catch-up's;
3. **two lanes** (now): the same; one poller per lane, each with its own position in the
   stream and its own relay, as the two event source mappings (infra/relay.py).

``--spike``: the catch-up is in the stream before the relay starts (a relay that was down):
the on-time lane then first reads past its records (filtered, not sent), which on one
DynamoDB Local stream shard takes seconds; on AWS the records spread over the table's
shards, and a mapping reads each shard at up to 1,000 records a call.

Printed: steady's strict lag (receivable minus scheduled_for, as the relay measures it:
EnqueueLagStrict) p50/p95/p99/max per run, the catch-up's drain time, and the ratios.
Each lane's relay runs in a process of its own, as each lane is a Lambda of its own on AWS;
they share this machine's cores with the engines and the writers (AWS shares none of that
between the lanes), so the two-lane figure here is the pessimistic one.

Run: ``make bench-fairness`` (``BENCH_ARGS='--catchup 20000'``; ``--help``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import occurrence_to_item
from punctual.dal.tables import create_tables
from punctual.dal.tenants import tenant_to_item
from punctual.domain.ids import new_schedule_id, occurrence_id
from punctual.domain.occurrence import Lane, Occurrence
from punctual.domain.planning import MAX_CATCHUP_SPREAD
from punctual.domain.tenancy import Quotas, Tenant
from punctual.integrations.streams import ANY_LANE
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings
from punctual_local.engines import ensure_engines
from punctual_local.stack import StackOptions, configure_environment
from punctual_local.stats import percentile
from punctual_local.streams import StreamPoller

FLOOD, STEADY = "flood", "steady"
FLOOD_SCHEDULES = 1000  # the catch-up's occurrences are spread over this many schedules
WRITE_BATCH = 25  # BatchWriteItem's most


@dataclass
class Run:
    strict_lags: list[float] = field(default_factory=list)
    strict_sent_at: list[float] = field(default_factory=list)  # when each lag's batch was sent
    strict_written: int = 0
    catchup_sent: int = 0
    catchup_done_at: float = 0.0
    started: float = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catchup", type=int, default=100_000, help="the flood's occurrences")
    parser.add_argument("--strict-per-second", type=float, default=20.0)
    parser.add_argument("--slack", type=float, default=5.0, help="seconds written before due")
    parser.add_argument("--alone-seconds", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--spike",
        action="store_true",
        help="the catch-up is in the stream before the relay starts (default: written while "
        "it runs)",
    )
    args = parser.parse_args()
    results = {}
    for name, catchup, lanes in (
        ("alone", 0, 2),
        ("one lane (before)", args.catchup, 1),
        ("two lanes (now)", args.catchup, 2),
    ):
        print(f"== {name}: {catchup:,} catch-up occurrences, {lanes} poller(s)", flush=True)
        results[name] = measure(args, catchup, lanes)
        report(name, results[name], catchup)
    alone, before, now = (percentile(r.strict_lags, 99) for r in results.values())
    print(
        f"strict lag p99 of the steady tenant: alone {alone:.2f} s; next to "
        f"{args.catchup:,} catch-up occurrences: one lane {before:.2f} s, two lanes "
        f"{now:.2f} s (moved by {now - alone:+.2f} s with lanes, {before - alone:+.2f} s "
        "without)"
    )


def measure(args: argparse.Namespace, catchup: int, lanes: int) -> Run:
    data = Path(tempfile.mkdtemp(prefix="punctual-fairness-"))
    engines = ensure_engines(data, in_memory=True)
    try:
        configure_environment(engines, StackOptions(data=data))
        return _measure(args, catchup, lanes, data)
    finally:
        engines.stop()


def _measure(args: argparse.Namespace, catchup: int, lanes: int, data: Path) -> Run:
    settings = Settings()
    services = Services(boto3.client("dynamodb"), boto3.client("sqs"), settings, time.time)
    create_tables(services.dynamodb, settings)
    created = datetime.now(UTC)
    for tenant in (FLOOD, STEADY):
        quotas = Quotas(max_schedules=10**7, max_strict_fires_per_minute=10**6)
        item = tenant_to_item(Tenant(tenant_id=tenant, quotas=quotas, created_at=created))
        services.dynamodb.put_item(TableName=settings.tenants_table, Item=to_dynamo(item))
        ControlPlane(services).create_target(tenant, "default")

    def flood() -> None:
        started = time.time()
        _flood(services, catchup)
        written = time.time() - started
        print(f"catch-up written in {written:.1f} s ({catchup / written:,.0f}/s)", flush=True)

    if catchup and args.spike:
        flood()
    run = Run(started=time.time())
    context = multiprocessing.get_context("fork")  # the engines' settings are inherited
    sent: Any = context.Queue()
    stop = context.Event()
    pollers = [
        context.Process(
            target=_relay_lane, args=(lane, data / f"streams-{n}.json", sent, stop), daemon=True
        )
        for n, lane in enumerate([ANY_LANE] if lanes == 1 else [None, Lane.CATCHUP.value])
    ]
    for poller in pollers:
        poller.start()
    if catchup and not args.spike:
        threading.Thread(target=flood, daemon=True).start()
    # The strict fires go on while the catch-up is being sent (or for a while alone).
    interval = 1 / args.strict_per_second
    ends = time.time() + args.alone_seconds
    while (run.catchup_sent < catchup) if catchup else time.time() < ends:
        if time.time() > run.started + args.timeout:
            break
        began = time.time()
        due = int(began + args.slack)
        _write(services, [_occurrence(STEADY, new_schedule_id(STEADY), due, due)])
        run.strict_written += 1
        _collect(sent, run)
        time.sleep(max(0.0, interval - (time.time() - began)))
    deadline = time.time() + 60
    while len(run.strict_lags) < run.strict_written and time.time() < deadline:
        _collect(sent, run)
        time.sleep(0.1)
    stop.set()
    for poller in pollers:
        poller.join()
    return run


def _collect(sent: Any, run: Run) -> None:
    """What the lanes' processes reported sent so far."""
    while not sent.empty():
        strict, catchup, at = sent.get()
        run.strict_lags += strict
        run.strict_sent_at += [at] * len(strict)
        run.catchup_sent += catchup
        if catchup:
            run.catchup_done_at = at


def _relay_lane(lane: str | None, checkpoints: Path, sent: Any, stop: Any) -> None:
    """One lane's relay in a process of its own (its own CPU, as its own Lambda): a poller
    of the stream handing its lane's records to the relay; what it sent goes to ``sent``."""
    services = Services(boto3.client("dynamodb"), boto3.client("sqs"), Settings(), time.time)
    relay = Relay(services)

    def handle(event: dict[str, Any]) -> dict[str, Any]:
        report = relay.relay(event["Records"])
        strict = [lag for is_strict, lag in report.lags if is_strict]
        sent.put((strict, len(report.catchup_lags), time.time()))
        return {"batchItemFailures": [{"itemIdentifier": k} for k in report.failures]}

    poller = StreamPoller(
        services.dynamodb,
        boto3.client("dynamodbstreams"),
        services.settings.occurrences_table,
        handle,
        checkpoints,
        lane=lane,
    )
    while not stop.is_set():
        if not poller.poll_once():
            stop.wait(0.05)


def _write(services: Services, occurrences: list[Occurrence]) -> None:
    requests = [
        {"PutRequest": {"Item": to_dynamo(occurrence_to_item(o, {"job": "fairness"}))}}
        for o in occurrences
    ]
    table = services.settings.occurrences_table
    while requests:
        answer = services.dynamodb.batch_write_item(RequestItems={table: requests})
        requests = answer.get("UnprocessedItems", {}).get(table, [])


def _occurrence(tenant: str, schedule_id: str, fire: int, receivable: int) -> Occurrence:
    return Occurrence(
        occurrence_id=occurrence_id(schedule_id, 1, fire),
        tenant_id=tenant,
        schedule_id=schedule_id,
        schedule_version=1,
        scheduled_for=fire,
        available_at=receivable,
        target="default",
        lane=Lane.CATCHUP if tenant == FLOOD else None,
    )


def _flood(services: Services, count: int, writers: int = 4) -> None:
    """The catch-up: ``count`` late fires of FLOOD_SCHEDULES schedules, released from now
    and spread over MAX_CATCHUP_SPREAD, written by a few threads at once."""
    schedules = [new_schedule_id(FLOOD) for _ in range(FLOOD_SCHEDULES)]
    now = int(time.time())
    made = [
        _occurrence(
            FLOOD,
            schedules[n % FLOOD_SCHEDULES],
            now - 86_400 + (n // FLOOD_SCHEDULES) * 60,
            now + n * MAX_CATCHUP_SPREAD // count,
        )
        for n in range(count)
    ]
    batches = [made[i : i + WRITE_BATCH] for i in range(0, count, WRITE_BATCH)]
    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(lambda batch: _write(services, batch), batches))


def report(name: str, run: Run, catchup: int) -> None:
    lags = run.strict_lags
    if not lags:
        print(f"{name}: no strict occurrence relayed")
        return
    print(
        f"{name}: steady strict lag over {len(lags):,} of {run.strict_written:,} "
        f"occurrences: p50 {percentile(lags, 50):.2f} s, p95 {percentile(lags, 95):.2f} s, "
        f"p99 {percentile(lags, 99):.2f} s, max {max(lags):.2f} s",
        flush=True,
    )
    windows: dict[int, list[float]] = {}
    for at, lag in zip(run.strict_sent_at, lags, strict=True):
        windows.setdefault(int((at - run.started) // 10), []).append(lag)
    print(
        f"{name}: p99 per 10 s of the run: "
        + ", ".join(f"{percentile(w, 99):.1f}" for _, w in sorted(windows.items())),
        flush=True,
    )
    if catchup:
        drained = run.catchup_done_at - run.started
        print(
            f"{name}: catch-up: {run.catchup_sent:,} sent in {drained:.1f} s "
            f"({run.catchup_sent / drained:,.0f}/s)",
            flush=True,
        )


if __name__ == "__main__":
    main()

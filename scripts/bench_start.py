"""Start precision: when a worker SDK's handler starts against its occurrence's instant, on
the local engines, for a target without early delivery and one with it (docs/worker.md,
*Starting on the instant*).

N strict one-shots per target due at one instant 30 s ahead, in several rounds, made by the
API, relayed from the stream by the relay and consumed by ``QueueConsumer`` long polls (two
per target, 10 threads each). Prints, per
target, the receivable lag (the message's receivable instant, from SQS's SentTimestamp
and the delay the relay chose, minus available_at) and the handler-start lag (the
handler's first line minus available_at), p50/p95/p99/max, and how many started early.
Run: ``make bench-start`` (options: ``BENCH_ARGS='--per-target 200'``; ``--help``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from punctual.clients import aws_client
from punctual.control.plane import ControlPlane
from punctual.dal.tables import create_tables
from punctual.domain.schedule import ScheduleDefinition
from punctual.domain.tenancy import Quotas
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings
from punctual.timing import utc_text
from punctual_client.worker import Job, QueueConsumer, Worker
from punctual_local.engines import ensure_engines
from punctual_local.stack import StackOptions, configure_environment
from punctual_local.stats import percentile
from punctual_local.streams import StreamPoller

TENANT = "bench"
TARGETS = {"plain": False, "early": True}  # target name -> early delivery
LEAD_SECONDS = 30  # the instant is this far ahead of the round's start: made and sent before it
CONSUMERS = 2  # long-poll consumers per target, each running a received batch on 10 threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--per-target", type=int, default=20, help="one-shots per target due at each instant"
    )
    parser.add_argument("--rounds", type=int, default=5, help="instants, one after another")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="punctual-bench-start-"))
    engines = ensure_engines(data, in_memory=True)
    try:
        configure_environment(engines, StackOptions(data=data, lookahead_seconds=600))
        run(args)
    finally:
        engines.stop()


def run(args: argparse.Namespace) -> None:
    settings = Settings()
    services = Services(aws_client("dynamodb"), aws_client("sqs"), settings, time.time)
    create_tables(services.dynamodb, settings)
    plane = ControlPlane(services)
    plane.create_tenant(TENANT, Quotas(max_schedules=100_000, max_strict_fires_per_minute=100_000))
    queues = {
        name: plane.create_target(TENANT, name, early_delivery=early).queue_url
        for name, early in TARGETS.items()
    }
    starts: dict[str, float] = {}
    claims: list[float] = []  # a held message's hold end to its handler's start: the claim
    lock = threading.Lock()
    held = threading.local()  # (a delivery's hold, claim and handler run on one thread)

    def hold(seconds: float) -> None:
        time.sleep(seconds)
        held.end = time.time()

    def handler(job: Job) -> None:
        started = time.time()
        end, held.end = getattr(held, "end", None), None
        with lock:
            starts.setdefault(job.occurrence_id, started)
            if end is not None:
                claims.append(started - end)

    everything: dict[str, tuple[str, float]] = {}  # id -> (target, available_at)
    sends = SendLog(services.sqs)
    relaying = Relaying(Services(services.dynamodb, sends, settings, time.time))
    for round_no in range(args.rounds):
        due = int(time.time()) + LEAD_SECONDS
        made = make_due(plane, args.per_target, due)
        relaying.until_sent(len(made))
        consume(Worker(services, TENANT, handler, hold=hold), queues, starts, set(made), due)
        everything.update({i: (target, float(due)) for i, target in made.items()})
        print(f"round {round_no + 1}: {len(made)} due at {utc_text(due)}, {len(starts)} started")
    report(everything, starts, sends)
    if claims:
        print(
            f"  of which the claim (a held message's hold end to its handler's start, one "
            f"DynamoDB read and transaction): p50 {percentile(claims, 50) * 1000:.0f} ms, "
            f"p99 {percentile(claims, 99) * 1000:.0f} ms"
        )


def make_due(plane: ControlPlane, per_target: int, due: int) -> dict[str, str]:
    """``per_target`` one-shots on each target due at ``due``: their occurrences (made by
    the API: the instant is inside its horizon) and their targets."""
    made: dict[str, str] = {}
    at = datetime.fromtimestamp(due, UTC).isoformat()
    for target in TARGETS:
        for _ in range(per_target):
            definition = ScheduleDefinition.model_validate(
                {"target": target, "spec": {"kind": "at", "at": at}}
            )
            saved = plane.create(TENANT, definition)
            made.update({o.occurrence_id: target for o in saved.materialized})
    return made


class Relaying:
    """The relay, handed the occurrences stream's INSERT batches by one poller (as the
    event source mapping does), through the rounds."""

    def __init__(self, services: Services) -> None:
        self.relay = Relay(services)
        self.sent = 0
        self.poller = StreamPoller(
            services.dynamodb,
            aws_client("dynamodbstreams"),
            services.settings.occurrences_table,
            self._batch,
            Path(tempfile.mkdtemp()) / "streams.json",
        )

    def _batch(self, event: dict[str, Any]) -> dict[str, Any]:
        report = self.relay.relay(event["Records"])
        self.sent += report.sent
        return {"batchItemFailures": [{"itemIdentifier": k} for k in report.failures]}

    def until_sent(self, count: int) -> None:
        """Until ``count`` more messages were sent (or 2 minutes passed)."""
        target, started = self.sent + count, time.monotonic()
        while self.sent < target and time.monotonic() - started < 120:
            self.poller.poll_once()


def consume(
    worker: Worker,
    queues: dict[str, str],
    starts: dict[str, float],
    expected: set[str],
    due: int,
) -> None:
    """CONSUMERS QueueConsumers per target (10 threads each, 1 s long polls) from 3 s before
    ``due`` until every expected handler started, or 30 s after it."""
    stop = threading.Event()
    consumers = [
        QueueConsumer(worker, url, wait_seconds=1, threads=10)
        for url in queues.values()
        for _ in range(CONSUMERS)
    ]
    time.sleep(max(0.0, due - 3 - time.time()))
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    while not expected <= starts.keys() and time.time() < due + 30:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join()


def report(made: dict[str, tuple[str, float]], starts: dict[str, float], sends: SendLog) -> None:
    enqueued = sends.receivable
    print("lag after available_at, seconds (negative: before it):")
    for target, early in TARGETS.items():
        ids = [i for i, (t, _) in made.items() if t == target]
        start_lags = [starts[i] - made[i][1] for i in ids if i in starts]
        receivable_lags = [enqueued[i] - made[i][1] for i in ids if i in enqueued]
        label = f"{target} (early delivery {'on' if early else 'off'})"
        print(f"  {label}: {len(start_lags)} of {len(ids)} handlers started")
        for name, lags in (("receivable", receivable_lags), ("handler start", start_lags)):
            if lags:
                print(
                    f"    {name:<14} p50 {percentile(lags, 50):+.3f}  "
                    f"p95 {percentile(lags, 95):+.3f}  p99 {percentile(lags, 99):+.3f}  "
                    f"max {max(lags):+.3f}  before the instant: {sum(1 for v in lags if v < 0)}"
                )


class SendLog:
    """The SQS client, noting for each message the relay sends when it becomes receivable:
    the end of its SendMessageBatch call plus the delay the relay chose."""

    def __init__(self, real: Any) -> None:
        self.real, self.receivable = real, dict[str, float]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def send_message_batch(self, **request: Any) -> Any:
        answer = self.real.send_message_batch(**request)
        sent = time.time()
        for entry in request["Entries"]:
            occurrence_id = json.loads(entry["MessageBody"])["occurrence_id"]
            # (the first send: a later one is a re-send, not when it became receivable)
            self.receivable.setdefault(occurrence_id, sent + entry.get("DelaySeconds", 0))
        return answer


if __name__ == "__main__":
    main()

"""Lag of an occurrence made at its own time (a run now), through the local pipeline, with
and without the on-time relay mapping's batching window (issue 21).

A window of W seconds lets the mapping wait up to W to fill a batch: fuller batches, fewer
Lambda invocations and log lines. Its price falls on what is made less than W before its
time; the API sends that itself, at once, after its commit (ControlPlane._send_promptly),
and the stream's record sends it again. So each run now here is received twice: the first
message is its lag with the prompt send, the relay's copy is what its lag would be without
it. Engines as `make run` uses them (DynamoDB Local, the SQS engine), the on-time lane's
poller reading the stream 4 times a second as a mapping does, the real API code in process.

Prints, per window: the lag from the API's request to the first receipt (p50, p99, max), and
the relay's copy's. Run: ``make bench-prompt`` (``BENCH_ARGS='--runs 40 --window 2'``).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from punctual.control.plane import ControlPlane
from punctual.domain.tenancy import Quotas
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings
from punctual_local.engines import ensure_engines
from punctual_local.stack import StackOptions, configure_environment
from punctual_local.stats import percentile
from punctual_local.streams import StreamPoller

POLL_SECONDS = 0.25  # a stream mapping polls each shard 4 times a second
TENANT = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40, help="runs now per window")
    parser.add_argument("--window", type=int, default=2, help="the on-time mapping's window, s")
    parser.add_argument("--gap", type=float, default=0.7, help="seconds between runs now")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="punctual-bench-"))
    engines = ensure_engines(data, in_memory=True)
    try:
        configure_environment(engines, StackOptions(data=data))
        for window in (0, args.window):
            report(window, measure(window, args.runs, args.gap))
    finally:
        engines.stop()


def measure(window: int, runs: int, gap: float) -> dict[str, list[float]]:
    """Each run now's (answered, first receipt, second receipt), on fresh tables."""
    import boto3

    from punctual.dal.tables import create_tables

    prefix = f"w{window}-{int(time.time())}"
    settings = Settings(relay_window_seconds=window).model_copy(
        update={
            name: f"{prefix}-{getattr(Settings(), name)}"
            for name in (
                "schedules_table",
                "occurrences_table",
                "tenants_table",
                "leases_table",
                "idempotency_table",
                "ledger_table",
            )
        }
    )
    services = Services(boto3.client("dynamodb"), boto3.client("sqs"), settings, time.time)
    create_tables(services.dynamodb, settings)
    plane = ControlPlane(services)
    plane.create_tenant(TENANT, Quotas(max_manual_runs_per_minute=100_000))
    url = plane.create_target(TENANT, f"prompt{window}").queue_url
    from punctual.domain.schedule import ScheduleDefinition

    schedule = plane.create(
        TENANT,
        ScheduleDefinition.model_validate(
            {
                "spec": {"kind": "cron", "expression": "0 0 1 1 *", "timezone": "UTC"},
                "target": f"prompt{window}",
            }
        ),
    ).schedule
    relay = Relay(services)
    poller = StreamPoller(
        services.dynamodb,
        boto3.client("dynamodbstreams"),
        settings.occurrences_table,
        lambda event: {
            "batchItemFailures": [
                {"itemIdentifier": k} for k in relay.relay(event["Records"]).failures
            ]
        },
        Path(tempfile.mkdtemp()) / "streams.json",
        lane=None,
        window=window,
    )
    stop = threading.Event()
    receipts: dict[str, list[float]] = {}
    threads = [
        threading.Thread(target=_loop, args=(poller.poll_once, stop), daemon=True),
        threading.Thread(target=_consume, args=(services.sqs, url, receipts, stop), daemon=True),
    ]
    for thread in threads:
        thread.start()
    answered: dict[str, float] = {}
    for n in range(runs):
        asked = time.time()  # the lag counts the API's own work, its prompt send included
        made = plane.trigger(TENANT, schedule.schedule_id, f"run-{n}").occurrence
        answered[made.occurrence_id] = asked
        time.sleep(gap)
    deadline = time.time() + window + 15
    expected = 2 if window else 1
    while time.time() < deadline and any(len(receipts.get(o, [])) < expected for o in answered):
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    lags: dict[str, list[float]] = {"first": [], "relay's copy": []}
    for oid, at in answered.items():
        got = sorted(receipts.get(oid, []))
        if got:
            lags["first"].append(got[0] - at)
        if len(got) >= expected:
            lags["relay's copy"].append(got[-1] - at)
    lags["missing"] = [float(len([o for o in answered if o not in receipts]))]
    return lags


def _loop(work: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        work()
        stop.wait(POLL_SECONDS)


def _consume(sqs: Any, url: str, receipts: dict[str, list[float]], stop: threading.Event) -> None:
    import json

    while not stop.is_set():
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
        now = time.time()
        for message in batch:
            receipts.setdefault(json.loads(message["Body"])["occurrence_id"], []).append(now)
        if batch:
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
                ],
            )


def report(window: int, lags: dict[str, list[float]]) -> None:
    how = "the relay alone" if not window else "the API's prompt send, then the relay's copy"
    print(f"window {window} s ({how}), seconds from the API's request to the receipt:")
    for label in ("first", "relay's copy"):
        values = lags[label]
        if not values or (label != "first" and not window):
            continue
        print(
            f"  {label:13} n={len(values):3}  p50 {percentile(values, 50):5.2f}  "
            f"p99 {percentile(values, 99):5.2f}  max {max(values):5.2f}"
        )
    if lags["missing"][0]:
        print(f"  WARNING: {lags['missing'][0]:.0f} runs never received")


if __name__ == "__main__":
    main()

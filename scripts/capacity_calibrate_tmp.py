"""Temporary: instrumented make bench (moved into scripts/capacity.py afterwards)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import scripts.bench_pipeline as bench
from punctual.materializer import Materializer, ShardReport
from punctual.relay import Relay, RelayReport
from punctual.local.streams import StreamPoller


class Probe:
    def __init__(self) -> None:
        self.phase = "seed"
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = {}
        self.groups: list[list[float]] = []
        self.batches: list[list[float]] = []
        self.polls: list[list[float]] = []
        self.results: dict[str, Any] = {}

    def note(self, op: str, wall: float, cpu: float) -> None:
        with self.lock:
            entry = self.calls.setdefault(f"{self.phase}:{op}", [0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += wall
            entry[2] += cpu


PROBE = Probe()


class TimedMetered(bench.Metered):
    def __getattr__(self, name: str) -> Any:
        if name == "get_paginator":
            client = self._client

            def get_paginator(operation: str) -> Any:
                return _TimedPaginator(client.get_paginator(operation), operation)

            return get_paginator
        attribute = super().__getattr__(name)
        if not callable(attribute):
            return attribute

        def call(**request: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return attribute(**request)
            finally:
                PROBE.note(name, time.perf_counter() - wall, time.thread_time() - cpu)

        return call


class _TimedPaginator:
    def __init__(self, paginator: Any, operation: str) -> None:
        self._paginator = paginator
        self._operation = operation

    def paginate(self, **request: Any) -> Iterator[Any]:
        pages = iter(self._paginator.paginate(**request))
        while True:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                page = next(pages)
            except StopIteration:
                PROBE.note(f"{self._operation}_page", time.perf_counter() - wall, 0.0)
                return
            PROBE.note(f"{self._operation}_page", time.perf_counter() - wall,
                       time.thread_time() - cpu)
            yield page


class TimedMaterializer(Materializer):
    def run(self, tick: int, shards: Any) -> list[ShardReport]:
        if self.settings.lookahead_seconds == 0:
            return super().run(tick, shards)  # the bench's warm-up, not measured
        PROBE.phase = "materialize"
        wall, cpu = time.perf_counter(), time.thread_time()
        reports = super().run(tick, shards)
        with PROBE.lock:
            PROBE.groups.append(
                [wall, time.perf_counter(), time.thread_time() - cpu,
                 sum(r.occurrences for r in reports), sum(r.buckets for r in reports)]
            )
        return reports


class TimedRelay(Relay):
    def relay(self, records: Any) -> RelayReport:
        PROBE.phase = "relay"
        records = list(records)
        wall = time.perf_counter()
        report = super().relay(records)
        queues = {r["dynamodb"]["NewImage"]["tenant_id"]["S"] for r in records}
        PROBE.batches.append([wall, time.perf_counter(), len(records), len(queues)])
        return report


class TimedPoller(StreamPoller):
    def poll_once(self) -> int:
        wall = time.perf_counter()
        handed = super().poll_once()
        PROBE.polls.append([wall, time.perf_counter(), handed])
        return handed


def main() -> None:
    original_lags, original_costs = bench.report_lags, bench.report_costs

    def report_lags(received: list[tuple[float, float, float]], made: int) -> None:
        lags = [r - s for s, r, _ in received]
        PROBE.results["lags"] = [bench.percentile(lags, p) for p in (50, 95, 99)]
        PROBE.results["received"] = len(received)
        PROBE.results["last_sent_before_due"] = None
        original_lags(received, made)

    def report_costs(*args: Any) -> None:
        PROBE.results["materialize_cpu"] = args[4]
        PROBE.results["relay_cpu"] = args[5]
        PROBE.results["made"] = args[2]
        original_costs(*args)

    bench.Metered = TimedMetered  # type: ignore[misc]
    bench.Materializer = TimedMaterializer  # type: ignore[misc]
    bench.Relay = TimedRelay  # type: ignore[misc]
    bench.StreamPoller = TimedPoller  # type: ignore[misc]
    bench.report_lags = report_lags
    bench.report_costs = report_costs
    sys.argv = [sys.argv[0], "--schedules", "20000"]
    bench.main()
    groups, batches, polls = PROBE.groups, PROBE.batches, PROBE.polls
    out = {
        "materialize_seconds": max(g[1] for g in groups) - min(g[0] for g in groups),
        "relay_seconds": max(p[1] for p in polls) - min(p[0] for p in polls),
        "groups": groups,
        "batches": batches,
        "polls": len(polls),
        "calls": PROBE.calls,
        **PROBE.results,
    }
    print("CALIBRATION " + json.dumps(out))


if __name__ == "__main__":
    main()

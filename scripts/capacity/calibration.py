"""The local cross-check of the model against `make bench`, and `--calibrate`: make bench
run instrumented to measure the figures the model uses."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from scripts.capacity.model import PAGE_BYTES, Design, LocalBench, Workload
from scripts.capacity.simulation import Scenario, SimResult, simulate

# --- the local cross-check ---------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    what: str
    predicted: float
    measured: float
    tolerance: float  # relative (fraction) or absolute seconds
    absolute: bool = False

    @property
    def ok(self) -> bool:
        if self.absolute:
            return abs(self.predicted - self.measured) <= self.tolerance
        return abs(self.predicted - self.measured) <= self.tolerance * self.measured


DURATION_TOLERANCE = 0.20
LAG_TOLERANCE = 0.05  # seconds
COUNT_TOLERANCE = 0.02


def local_scenario(m: LocalBench) -> Scenario:
    platform = m.local_platform()
    design = Design(
        shards=m.shards,
        group_size=m.group_size,
        lookahead=m.lookahead,
        map_concurrency=m.shards // m.group_size,
        relay_threads=m.tenants,
    )
    workload = Workload(
        strict_peak=m.schedules, flexible_peak=0, per_day=24 * m.schedules, tenants=m.tenants
    )
    batch = platform.relay_batch_seconds(500, m.tenants, m.tenants)
    per_poll = platform.poll_seconds + 2 * batch  # one GetRecords of 1,000 = 2 batches of 500
    return Scenario(
        workload=workload,
        design=design,
        platform=platform,
        relay_capacity=1000 / per_poll,
        relay_after_materialize=True,
        single_tick_at=-m.due_after_start,
    )


def cross_check(m: LocalBench) -> tuple[list[Check], SimResult]:
    scenario = local_scenario(m)
    result = simulate(scenario)
    per_shard = m.schedules / m.shards
    transactions = m.shards * math.ceil(per_shard / 49)
    pages = m.shards * (m.buckets_per_shard - 1 + math.ceil(per_shard * 750 / PAGE_BYTES))
    batches = math.ceil(m.schedules / 500)
    sends = batches * m.tenants * math.ceil(500 / m.tenants / 10)
    start = -m.due_after_start
    checks = [
        Check(
            "materialize, s",
            result.invocations_end - start,
            m.materialize_seconds,
            DURATION_TOLERANCE,
        ),
        Check(
            "relay, s",
            result.relay_end - result.invocations_end,
            m.relay_seconds,
            DURATION_TOLERANCE,
        ),
        Check("strict lag p50, s", result.strict[0], m.lag_p50, LAG_TOLERANCE, True),
        Check("strict lag p95, s", result.strict[1], m.lag_p95, LAG_TOLERANCE, True),
        Check("strict lag p99, s", result.strict[2], m.lag_p99, LAG_TOLERANCE, True),
        Check("transactions", transactions, m.transactions.count, COUNT_TOLERANCE),
        Check("due index pages", pages, m.query_pages.count, COUNT_TOLERANCE),
        Check(
            "lease writes",
            m.shards * (m.buckets_per_shard + 2),
            m.lease_writes.count,
            COUNT_TOLERANCE,
        ),
        Check("relay batches", batches, m.relay_batches, COUNT_TOLERANCE),
        Check("SendMessageBatch calls", sends, m.sends.count, COUNT_TOLERANCE),
    ]
    return checks, result


# --- calibration: make bench, instrumented -----------------------------------------------------


def calibrate(schedules: int) -> None:
    """Run the pipeline bench with every call timed per phase; prints the LocalBench figures.
    Loads the machine for about 6 minutes (as ``make bench``)."""
    import threading

    import scripts.bench_pipeline as bench
    from punctual.materializer import Materializer, ShardReport
    from punctual.relay import Relay, RelayReport
    from punctual_local.stats import percentile
    from punctual_local.streams import StreamPoller

    phase = ["seed"]
    lock = threading.Lock()
    calls: dict[str, list[float]] = {}
    groups: list[list[float]] = []
    batches: list[list[float]] = []
    polls: list[list[float]] = []
    results: dict[str, Any] = {}

    def note(op: str, wall: float, cpu: float) -> None:
        with lock:
            entry = calls.setdefault(f"{phase[0]}:{op}", [0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += wall
            entry[2] += cpu

    class Pages:
        def __init__(self, paginator: Any, operation: str) -> None:
            self.paginator, self.operation = paginator, operation

        def paginate(self, **request: Any) -> Iterator[Any]:
            pages = iter(self.paginator.paginate(**request))
            while True:
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    page = next(pages)
                except StopIteration:
                    return
                note(f"{self.operation}_page", time.perf_counter() - wall, time.thread_time() - cpu)
                yield page

    class TimedClient(bench.Metered):
        def __getattr__(self, name: str) -> Any:
            if name == "get_paginator":
                return lambda operation: Pages(self._client.get_paginator(operation), operation)
            attribute = super().__getattr__(name)
            if not callable(attribute):
                return attribute

            def call(**request: Any) -> Any:
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    return attribute(**request)
                finally:
                    note(name, time.perf_counter() - wall, time.thread_time() - cpu)

            return call

    class TimedMaterializer(Materializer):
        def run(self, tick: int, shards: Sequence[int]) -> list[ShardReport]:
            if self.settings.lookahead_seconds == 0:
                return super().run(tick, shards)  # the bench's warm-up
            phase[0] = "materialize"
            wall, cpu = time.perf_counter(), time.thread_time()
            reports = super().run(tick, shards)
            with lock:
                groups.append(
                    [
                        wall,
                        time.perf_counter(),
                        time.thread_time() - cpu,
                        sum(r.occurrences for r in reports),
                        sum(r.buckets for r in reports),
                    ]
                )
            return reports

    class TimedRelay(Relay):
        def relay(self, records: Any, *, started_at: int | None = None) -> RelayReport:
            phase[0] = "relay"
            records = list(records)
            wall = time.perf_counter()
            answer = super().relay(records, started_at=started_at)
            batches.append([wall, time.perf_counter(), len(records)])
            return answer

    class TimedPoller(StreamPoller):
        def poll_once(self) -> int:
            wall = time.perf_counter()
            handed = super().poll_once()
            polls.append([wall, time.perf_counter(), handed])
            return handed

    report_lags, report_costs = bench.report_lags, bench.report_costs

    def lags(received: list[Any], made: int) -> None:
        first: dict[str, Any] = {}
        for entry in sorted(received, key=lambda e: e[-1]):
            first.setdefault(entry[0], entry)
        values = [e[-2] - e[-3] for e in first.values()]
        results["lags"] = [percentile(values, p) for p in (50, 95, 99)]
        report_lags(received, made)

    def costs(*args: Any) -> None:
        results["materialize_cpu"], results["relay_cpu"] = args[4], args[5]
        results["load_average"] = _load_average()
        report_costs(*args)

    # The bench looks these names up when it runs: swap in the timed ones.
    for name, replacement in (
        ("Metered", TimedClient),
        ("Materializer", TimedMaterializer),
        ("Relay", TimedRelay),
        ("StreamPoller", TimedPoller),
        ("report_lags", lags),
        ("report_costs", costs),
    ):
        setattr(bench, name, replacement)
    sys.argv = [sys.argv[0], "--schedules", str(schedules)]
    bench.main()
    out = {
        "materialize_seconds": max(g[1] for g in groups) - min(g[0] for g in groups),
        "relay_seconds": max(p[1] for p in polls if p[2]) - min(p[0] for p in polls),
        "relay_batch_wall": sum(b[1] - b[0] for b in batches),
        "relay_batches": len(batches),
        "polls": sum(1 for p in polls if p[2]),
        "buckets_per_shard": sum(g[4] for g in groups) / max(1, len(groups)),
        "calls (count, wall s, cpu s)": calls,
        **results,
    }
    print(json.dumps(out, indent=1))


def _load_average() -> float:
    try:
        with open("/proc/loadavg") as source:
            return float(source.read().split()[0])
    except OSError:
        return math.nan

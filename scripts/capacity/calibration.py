"""The local cross-check of the model against `make bench`, and `--calibrate`: make bench
run instrumented to measure the figures the model uses."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
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
    import scripts.bench_pipeline as bench

    recorder = _Recorder()
    # The bench looks these names up when it runs: swap in the timed ones.
    for name, replacement in (
        ("Metered", _timed_client(recorder)),
        ("Materializer", _timed_materializer(recorder)),
        ("Relay", _timed_relay(recorder)),
        ("StreamPoller", _timed_poller(recorder)),
        ("report_lags", _recording_lags(bench.report_lags, recorder)),
        ("report_costs", _recording_costs(bench.report_costs, recorder)),
    ):
        setattr(bench, name, replacement)
    sys.argv = [sys.argv[0], "--schedules", str(schedules)]
    bench.main()
    print(json.dumps(recorder.figures(), indent=1))


@dataclass
class _Recorder:
    """What the instrumented bench measured: each call's count, wall and CPU seconds by
    phase (``calls``: "phase:operation" -> [count, wall, cpu]), each materializer invocation
    (``groups``: start, end, CPU, occurrences, buckets), each relay batch (``batches``:
    start, end, records) and stream poll (``polls``: start, end, records handed on), and the
    figures the bench's reports were given (``results``)."""

    phase: str = "seed"
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: dict[str, list[float]] = field(default_factory=dict)
    groups: list[list[float]] = field(default_factory=list)
    batches: list[list[float]] = field(default_factory=list)
    polls: list[list[float]] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    def note(self, op: str, wall: float, cpu: float) -> None:
        with self.lock:
            entry = self.calls.setdefault(f"{self.phase}:{op}", [0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += wall
            entry[2] += cpu

    def figures(self) -> dict[str, Any]:
        """The LocalBench figures, and every call's count and times."""
        groups, polls, batches = self.groups, self.polls, self.batches
        return {
            "materialize_seconds": max(g[1] for g in groups) - min(g[0] for g in groups),
            "relay_seconds": max(p[1] for p in polls if p[2]) - min(p[0] for p in polls),
            "relay_batch_wall": sum(b[1] - b[0] for b in batches),
            "relay_batches": len(batches),
            "polls": sum(1 for p in polls if p[2]),
            "buckets_per_shard": sum(g[4] for g in groups) / max(1, len(groups)),
            "calls (count, wall s, cpu s)": self.calls,
            **self.results,
        }


class _TimedPages:
    """A paginator whose every page's fetch is noted as ``<operation>_page``."""

    def __init__(self, paginator: Any, operation: str, recorder: _Recorder) -> None:
        self.paginator, self.operation, self.recorder = paginator, operation, recorder

    def paginate(self, **request: Any) -> Iterator[Any]:
        pages = iter(self.paginator.paginate(**request))
        while True:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                page = next(pages)
            except StopIteration:
                return
            self.recorder.note(
                f"{self.operation}_page", time.perf_counter() - wall, time.thread_time() - cpu
            )
            yield page


def _timed_client(recorder: _Recorder) -> type[Any]:
    """The bench's metered client, each call (and each page) timed too."""
    from scripts.bench_pipeline import Metered

    class TimedClient(Metered):
        def __getattr__(self, name: str) -> Any:
            if name == "get_paginator":
                return lambda operation: _TimedPages(
                    self._client.get_paginator(operation), operation, recorder
                )
            attribute = super().__getattr__(name)
            if not callable(attribute):
                return attribute

            def call(**request: Any) -> Any:
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    return attribute(**request)
                finally:
                    recorder.note(name, time.perf_counter() - wall, time.thread_time() - cpu)

            return call

    return TimedClient


def _timed_materializer(recorder: _Recorder) -> type[Any]:
    """The materializer, each invocation timed (the bench's warm-up aside), its calls in the
    "materialize" phase."""
    from punctual.pipeline.materializer import Materializer, ShardReport

    class TimedMaterializer(Materializer):
        def run(self, tick: int, shards: Sequence[int]) -> list[ShardReport]:
            if self.settings.lookahead_seconds == 0:
                return super().run(tick, shards)  # the bench's warm-up
            recorder.phase = "materialize"
            wall, cpu = time.perf_counter(), time.thread_time()
            reports = super().run(tick, shards)
            with recorder.lock:
                recorder.groups.append(
                    [
                        wall,
                        time.perf_counter(),
                        time.thread_time() - cpu,
                        sum(r.occurrences for r in reports),
                        sum(r.buckets for r in reports),
                    ]
                )
            return reports

    return TimedMaterializer


def _timed_relay(recorder: _Recorder) -> type[Any]:
    """The relay, each batch timed, its calls in the "relay" phase."""
    from punctual.pipeline.relay import Relay, RelayReport

    class TimedRelay(Relay):
        def relay(self, records: Any, *, started_at: int | None = None) -> RelayReport:
            recorder.phase = "relay"
            records = list(records)
            wall = time.perf_counter()
            answer = super().relay(records, started_at=started_at)
            recorder.batches.append([wall, time.perf_counter(), len(records)])
            return answer

    return TimedRelay


def _timed_poller(recorder: _Recorder) -> type[Any]:
    """The stream poller, each poll timed."""
    from punctual_local.streams import StreamPoller

    class TimedPoller(StreamPoller):
        def poll_once(self) -> int:
            wall = time.perf_counter()
            handed = super().poll_once()
            recorder.polls.append([wall, time.perf_counter(), handed])
            return handed

    return TimedPoller


def _recording_lags(
    report_lags: Callable[[list[Any], int], None], recorder: _Recorder
) -> Callable[[list[Any], int], None]:
    """The bench's lag report, which also records the receivable lag's p50, p95 and p99."""
    from punctual_local.stats import percentile

    def lags(received: list[Any], made: int) -> None:
        first: dict[str, Any] = {}
        for entry in sorted(received, key=lambda e: e[-1]):
            first.setdefault(entry[0], entry)
        values = [e[-2] - e[-3] for e in first.values()]
        recorder.results["lags"] = [percentile(values, p) for p in (50, 95, 99)]
        report_lags(received, made)

    return lags


def _recording_costs(report_costs: Callable[..., None], recorder: _Recorder) -> Callable[..., None]:
    """The bench's cost report, which also records the stages' CPU and the load average."""

    def costs(*args: Any) -> None:
        recorder.results["materialize_cpu"], recorder.results["relay_cpu"] = args[4], args[5]
        recorder.results["load_average"] = _load_average()
        report_costs(*args)

    return costs


def _load_average() -> float:
    try:
        with open("/proc/loadavg") as source:
            return float(source.read().split()[0])
    except OSError:
        return math.nan

"""The discrete-event simulation of the top of the hour, the relay as a queue, the lags,
and the search for the smallest shard count and lookahead that hold at AWS scale."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scripts.capacity.model import (
    INF,
    MINUTE,
    PAGE_BYTES,
    Design,
    Limits,
    Platform,
    Workload,
    WriteOp,
)

# --- the discrete-event simulation -------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    workload: Workload
    design: Design
    platform: Platform
    failed_group: int | None = None  # fails at the first tick that walks the :00 bucket
    fail_after: float = 1.0  # seconds into each attempt (the lease it claimed stays held)
    rate_cap: float = INF  # schedules/s per shard the partition limits allow
    relay_capacity: float = INF  # records/s
    relay_shards: int = 0  # stream shards (0: the relay adds no batch time, the local poller)
    relay_after_materialize: bool = False  # the local bench relays after materializing
    single_tick_at: float | None = None  # local: one tick at this time (due = 0)
    ticks_after_peak: int = 12


@dataclass
class Piece:
    """Consecutive schedule steps of one (shard, bucket) committed at a steady pace."""

    shard: int
    bucket: int
    first: float  # position of the first step in the bucket's order (strict first, by due_at)
    count: float
    start: float  # when the first transaction began
    step_seconds: float  # one transaction
    per_transaction: int

    @property
    def end(self) -> float:
        return self.start + math.ceil(self.count / self.per_transaction) * self.step_seconds

    def samples(self, lo: float, hi: float, most: int = 16) -> Iterator[tuple[float, float, float]]:
        """(commit time, position, weight) at up to ``most`` evenly spread positions of
        [lo, hi): commit times are per transaction and positions map linearly to due times,
        so a few samples a piece describe its lags."""
        lo, hi = max(lo, self.first), min(hi, self.first + self.count)
        if hi <= lo:
            return
        n = max(1, min(most, math.ceil((hi - lo) / self.per_transaction)))
        width = (hi - lo) / n
        for i in range(n):
            position = lo + (i + 0.5) * width
            k = math.floor((position - self.first) / self.per_transaction)
            yield self.start + (k + 1) * self.step_seconds, position, width


@dataclass
class _Shard:
    watermark: int
    done: dict[int, float] = field(default_factory=dict)
    holder: int | None = None
    expires: float = -INF


@dataclass
class _Execution:
    tick: int  # the tick's scheduled time (what the materializer is given)
    started: float
    failing: bool
    pending: deque[int] = field(default_factory=deque)
    running: int = 0


@dataclass
class _Invocation:
    id: int
    execution: _Execution
    group: int
    attempt: int
    start: float
    deadline: float
    fail_at: float


@dataclass
class SimResult:
    strict: list[float]  # lag percentiles p50, p95, p99 (s)
    flexible: list[float]  # p50, p95, p99 past available_at (s)
    strict_committed: float  # share of the peak's strict occurrences materialized
    peak_rate: float  # schedules/s materialized at once, at most
    shard_rate: float  # schedules/s one shard materializes
    materialize_end: float  # last commit (s, relative to :00)
    invocations_end: float  # the last materializer invocation returned
    first_commit: float
    relay_end: float
    pieces: list[Piece]
    timeouts: int  # invocations killed by the Lambda timeout
    leases_waited: int  # claims refused because another holder's lease was live


class Simulation:
    """Ticks -> Map (at most ``map_concurrency`` groups at once) -> one invocation per group,
    which claims each of its shards in turn and walks the due buckets from the watermark to
    the tick's horizon; time is simulated, nothing sleeps."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        d, w = scenario.design, scenario.workload
        self.d, self.w, self.p = d, w, scenario.platform
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.ids = 0
        self.pieces: list[Piece] = []
        self.timeouts = 0
        self.leases_waited = 0
        self.last_end = -INF  # when the last invocation ended
        step = self.p.step_seconds(d.per_transaction)
        cap = scenario.rate_cap
        self.step = max(step, d.per_transaction / cap) if cap < INF else step
        self.lookahead_buckets = d.lookahead // MINUTE
        if scenario.single_tick_at is not None:
            # The bench's warm-up run left the watermark just past the current minute.
            first = math.floor(scenario.single_tick_at / MINUTE) + 1
        else:
            # Steady state: the first simulated tick (two before the one that first reaches
            # the :00 bucket) walks only the newest bucket of its horizon, bucket -2.
            first = -2
        self.shards = [_Shard(watermark=first) for _ in range(d.shards)]
        self.first_failing_tick = -self.lookahead_buckets

    # strict first (due_at = :00), then the uniform ones sorted by due_at
    def load(self, bucket: int) -> float:
        return (self.w.strict(bucket) + self.w.uniform(bucket)) / self.d.shards

    def push(self, at: float, kind: str, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def run(self) -> list[Piece]:
        s = self.s
        if s.single_tick_at is not None:
            self.push(s.single_tick_at, "tick", math.floor(s.single_tick_at))
        else:
            for k in range(-self.lookahead_buckets - 2, s.ticks_after_peak + 1):
                self.push(k * MINUTE + self.p.tick_delay, "tick", k * MINUTE)
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            if kind == "tick":
                self.tick(at, payload)
            elif kind == "start":
                self.start(at, *payload)
            elif kind == "claim":
                self.claim(at, *payload)
            elif kind == "end":
                self.end(at, *payload)
        return self.pieces

    def tick(self, at: float, tick: int) -> None:
        failing = self.s.failed_group is not None and tick == self.first_failing_tick * MINUTE
        execution = _Execution(tick=tick, started=at, failing=failing)
        execution.pending.extend(range(self.d.groups))
        single = self.s.single_tick_at is not None
        slots = self.d.groups if single else min(self.d.map_concurrency, self.d.groups)
        for _ in range(slots):
            self.next_group(at, execution)

    def next_group(self, at: float, execution: _Execution) -> None:
        if not execution.pending or at > execution.started + self.p.execution_timeout:
            return
        execution.running += 1
        self.push(at, "start", (execution, execution.pending.popleft(), 1))

    def start(self, at: float, execution: _Execution, group: int, attempt: int) -> None:
        begin = at + self.p.invoke_seconds + (self.p.cold_start if attempt > 1 else 0.0)
        fail = execution.failing and group == self.s.failed_group
        self.ids += 1
        invocation = _Invocation(
            id=self.ids,
            execution=execution,
            group=group,
            attempt=attempt,
            start=begin,
            deadline=begin + self.p.lambda_timeout,
            fail_at=begin + self.s.fail_after if fail else INF,
        )
        self.push(begin, "claim", (invocation, 0))

    def end(self, at: float, invocation: _Invocation, ok: bool) -> None:
        self.last_end = max(self.last_end, at)
        execution = invocation.execution
        retries = self.p.retry_intervals
        if not ok and invocation.attempt <= len(retries):
            again = at + retries[invocation.attempt - 1]
            if again < execution.started + self.p.execution_timeout:
                self.push(again, "start", (execution, invocation.group, invocation.attempt + 1))
                return
        execution.running -= 1
        self.next_group(at, execution)

    def claim(self, at: float, invocation: _Invocation, index: int) -> None:
        """Claim the group's ``index``-th shard and walk its buckets (one event per shard:
        nobody else touches a shard while its lease is held)."""
        p, d = self.p, self.d
        shards = range(invocation.group * d.group_size, (invocation.group + 1) * d.group_size)
        shards = range(shards.start, min(shards.stop, d.shards))
        kill = min(invocation.deadline, invocation.fail_at)
        if index >= len(shards):
            self.push(at, "end", (invocation, True))
            return
        if at >= kill:
            self.die(kill, invocation)
            return
        shard_id = shards[index]
        shard = self.shards[shard_id]
        t = at + p.write_seconds
        if not (shard.holder is None or shard.expires < t or shard.holder == invocation.id):
            self.leases_waited += 1
            self.push(t, "claim", (invocation, index + 1))
            return
        shard.holder, shard.expires = invocation.id, t + p.lease_seconds
        last = math.floor((invocation.execution.tick + d.lookahead) / MINUTE)
        # Materializer.run_shard checks the time left before each bucket and each
        # transaction: it stops cleanly (lease released, watermark kept) at ``stop``.
        stop = invocation.deadline - p.out_of_time
        stopped = False
        while shard.watermark <= last and t < stop:
            bucket = shard.watermark
            remaining = max(0.0, self.load(bucket) - shard.done.get(bucket, 0.0))
            pages = max(1, math.ceil(remaining * p.item_bytes / PAGE_BYTES))
            t += pages * p.page_seconds
            if t >= kill:
                shard.expires = kill + p.lease_seconds  # renewed up to the kill
                self.die(kill, invocation)
                return
            steps = math.ceil(remaining / d.per_transaction)
            if t + steps * self.step > min(kill, stop):
                # A transaction starts only before ``stop``; one started may finish after it.
                started = max(0, math.ceil((min(kill, stop) - t) / self.step))
                if t + started * self.step > kill:  # the failure (or the timeout) came first
                    whole = math.floor((kill - t) / self.step) * d.per_transaction
                    self.commit(shard_id, bucket, whole, t)
                    shard.expires = kill + p.lease_seconds  # renewed up to the kill
                    self.die(kill, invocation)
                    return
                self.commit(shard_id, bucket, min(remaining, started * d.per_transaction), t)
                t += started * self.step
                stopped = True
                break
            self.commit(shard_id, bucket, remaining, t)
            t += steps * self.step + p.write_seconds  # the watermark moves past the bucket
            shard.watermark += 1
        t += p.write_seconds  # release
        shard.holder, shard.expires = None, t - 1
        if stopped or t >= stop:
            self.push(t, "end", (invocation, True))  # out of time: no further shard claimed
        else:
            self.push(t, "claim", (invocation, index + 1))

    def commit(self, shard_id: int, bucket: int, count: float, start: float) -> None:
        if count <= 0:
            return
        shard = self.shards[shard_id]
        first = shard.done.get(bucket, 0.0)
        self.pieces.append(
            Piece(shard_id, bucket, first, count, start, self.step, self.d.per_transaction)
        )
        shard.done[bucket] = first + count

    def die(self, at: float, invocation: _Invocation) -> None:
        """Killed (timeout) or failed: no release; the lease it holds stays until it expires."""
        if at >= invocation.deadline:
            self.timeouts += 1
        self.push(at, "end", (invocation, False))


# --- the relay as a queue, and the lags ------------------------------------------------------


class Relay:
    """FIFO fluid queue of records: arrivals at commit + stream delay (or when the local
    poller starts), served at ``capacity`` records/s; a record is receivable when its batch
    is sent plus the SQS delay the relay rounds up to a whole second."""

    def __init__(self, scenario: Scenario, pieces: Sequence[Piece], opens: float) -> None:
        self.s = scenario
        self.opens = opens
        self.delay = scenario.platform.stream_delay
        self.grid: list[tuple[float, float, float]] | None = None  # (time, arrived, departed)
        peak = peak_rate(pieces)
        self.batch_seconds = 0.0
        if scenario.relay_shards:
            # Each poll of a shard hands over what arrived since the last one.
            records = min(
                scenario.design.stream_batch,
                max(1.0, peak * scenario.platform.poll_interval / scenario.relay_shards),
            )
            self.batch_seconds = scenario.platform.relay_batch_seconds(
                records,
                distinct_queues(records, scenario.workload.tenants),
                scenario.design.relay_threads,
            )
        if scenario.relay_capacity < INF and (
            peak > scenario.relay_capacity or scenario.relay_after_materialize
        ):
            self.grid = self._queue(pieces)

    def arrival(self, commit: float) -> float:
        return max(commit + self.delay, self.opens)

    def _queue(self, pieces: Sequence[Piece]) -> list[tuple[float, float, float]]:
        points: list[tuple[float, float]] = []
        for piece in pieces:
            chunks = max(1, min(64, math.ceil(piece.count / piece.per_transaction / 4)))
            for i in range(chunks):
                at = piece.start + (i + 1) / chunks * (piece.end - piece.start)
                points.append((self.arrival(at), piece.count / chunks))
        points.sort()
        dt = 0.05
        start = points[0][0]
        horizon = points[-1][0] - start + sum(c for _, c in points) / self.s.relay_capacity
        bins = [0.0] * (int(horizon / dt) + 2)
        for at, count in points:
            bins[min(len(bins) - 1, int((at - start) / dt))] += count
        grid: list[tuple[float, float, float]] = [(start, 0.0, 0.0)]
        arrived = departed = 0.0
        for i, count in enumerate(bins):
            arrived += count
            departed = min(arrived, departed + self.s.relay_capacity * dt)
            grid.append((start + (i + 1) * dt, arrived, departed))
        return grid

    def sent(self, commit: float, position: float) -> float:
        """When a record committed at ``commit`` is sent; ``position``: records arrived before
        it (used only when the relay queues)."""
        arrival = self.arrival(commit)
        if self.grid is None:
            return arrival + self.batch_seconds
        target = position
        lo, hi = 0, len(self.grid) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.grid[mid][2] >= target:
                hi = mid
            else:
                lo = mid + 1
        t1, _, d1 = self.grid[lo]
        t0, _, d0 = self.grid[max(0, lo - 1)]
        at = t1 if d1 <= d0 else t0 + (target - d0) / (d1 - d0) * (t1 - t0)
        return max(arrival + self.batch_seconds, at)


def receivable_lag(sent: float, available: float) -> float:
    """The relay sends with DelaySeconds = ceil(available_at - now) (never early)."""
    if sent >= available:
        return sent - available
    return math.ceil(available - sent) - (available - sent)


class LagHistogram:
    """Weighted lags in 1 ms bins up to 10 s, exact beyond."""

    RESOLUTION = 0.001
    BINS = 10_000

    def __init__(self) -> None:
        self.bins = [0.0] * self.BINS
        self.tail: list[tuple[float, float]] = []
        self.total = 0.0

    def add(self, lag: float, weight: float) -> None:
        self.total += weight
        index = int(lag / self.RESOLUTION)
        if index < self.BINS:
            self.bins[index] += weight
        else:
            self.tail.append((lag, weight))

    def percentiles(self, ps: Sequence[float]) -> list[float]:
        if self.total <= 0:
            return [INF for _ in ps]
        goals = sorted((p / 100 * self.total - 1e-9, i) for i, p in enumerate(ps))
        out = [INF] * len(ps)
        acc, g = 0.0, 0
        for index, weight in enumerate(self.bins):
            acc += weight
            while g < len(goals) and acc >= goals[g][0] and weight > 0:
                out[goals[g][1]] = (index + 0.5) * self.RESOLUTION
                g += 1
        for lag, weight in sorted(self.tail):
            acc += weight
            while g < len(goals) and acc >= goals[g][0]:
                out[goals[g][1]] = lag
                g += 1
        return out


def peak_rate(pieces: Sequence[Piece]) -> float:
    """Most schedules/s committed at the same time (all shards together)."""
    edges: list[tuple[float, float]] = []
    for piece in pieces:
        if piece.end > piece.start:
            rate = piece.count / (piece.end - piece.start)
            edges += [(piece.start, rate), (piece.end, -rate)]
    edges.sort()
    best = current = 0.0
    for _, delta in edges:
        current += delta
        best = max(best, current)
    return best


PHASES = 8  # poll phases per transaction: records of one transaction land on many shards


def simulate(scenario: Scenario) -> SimResult:
    sim = Simulation(scenario)
    pieces = sim.run()
    w, d, p = scenario.workload, scenario.design, scenario.platform
    ends = [piece.end for piece in pieces] or [0.0]
    opens = sim.last_end if scenario.relay_after_materialize else -INF
    relay = Relay(scenario, pieces, opens)
    strict_total = w.strict(0) / d.shards
    strict, flexible = LagHistogram(), LagHistogram()
    committed = 0.0
    order = sorted(pieces, key=lambda piece: piece.start)
    arrived = 0.0
    relay_end = -INF
    phases = [(i + 0.5) / PHASES * p.poll_interval for i in range(PHASES)]
    for piece in order:
        strict_hi = strict_total if piece.bucket == 0 else 0.0
        for commit, _, count in piece.samples(0.0, strict_hi):
            committed += count
            for phase in phases:
                sent = relay.sent(commit + phase, arrived + count / 2)
                strict.add(receivable_lag(sent, 0.0), count / PHASES)
                relay_end = max(relay_end, sent)
            arrived += count
        uniform = w.uniform(piece.bucket) / d.shards
        share = w.flexible(piece.bucket) / w.uniform(piece.bucket) if uniform else 0.0
        first_uniform = w.strict(piece.bucket) / d.shards
        if share == 0:
            arrived += max(0.0, piece.first + piece.count - max(piece.first, first_uniform))
            continue
        for i, (commit, position, count) in enumerate(
            piece.samples(first_uniform, first_uniform + uniform)
        ):
            available = piece.bucket * MINUTE + MINUTE * (position - first_uniform) / uniform
            sent = relay.sent(commit + phases[i % PHASES], arrived + count / 2)
            flexible.add(receivable_lag(sent, available), count * share)
            arrived += count
    if relay.grid is not None and pieces:
        relay_end = max(relay_end, relay.sent(max(ends), arrived))  # the last record out
    ps = (50, 95, 99)
    missing = w.strict_peak - committed * d.shards
    if missing > 0.5:
        strict.add(INF, missing / d.shards)
    return SimResult(
        strict=strict.percentiles(ps),
        flexible=flexible.percentiles(ps),
        strict_committed=min(1.0, committed * d.shards / max(1.0, w.strict_peak)),
        peak_rate=peak_rate(pieces),
        shard_rate=d.per_transaction / sim.step,
        materialize_end=max(ends),
        invocations_end=sim.last_end,
        first_commit=min((piece.start for piece in pieces), default=0.0),
        relay_end=relay_end,
        pieces=pieces,
        timeouts=sim.timeouts,
        leases_waited=sim.leases_waited,
    )


# --- AWS scenarios ---------------------------------------------------------------------------


def stream_shards(workload: Workload, item_bytes: int = 359, retention_days: int = 30) -> int:
    """Occurrences table partitions (one open stream shard each): 10 GB per partition."""
    stored = workload.per_day * retention_days * (item_bytes + 100)  # 100 B index overhead
    return max(1, math.ceil(stored / 10e9))


def distinct_queues(records: float, tenants: int) -> float:
    """Expected tenant queues among ``records`` records of ``tenants`` equally likely ones."""
    if records <= 1:
        return 1.0
    return float(tenants * (1 - math.pow(1 - 1 / tenants, records)))


def relay_capacity(workload: Workload, design: Design, platform: Platform, limits: Limits) -> float:
    """Records/s the relay can send at most: full batches on every stream shard, each with
    ``relay_parallelization`` batches at once, within the relay's reserved concurrency (its
    cap: DeployConfig.relay_concurrency)."""
    concurrency = min(
        stream_shards(workload) * design.relay_parallelization, design.relay_concurrency
    )
    batch = design.stream_batch
    full = platform.relay_batch_seconds(
        batch, distinct_queues(batch, workload.tenants), design.relay_threads
    )
    return concurrency * batch / full


def average_batch(workload: Workload, platform: Platform, window: float = 0.0) -> float:
    """Records a relay invocation gets at the average rate: what a stream shard gathers
    between polls, or over the mapping's batching window (none is configured)."""
    per_shard = workload.per_day / 86_400 / stream_shards(workload)
    return max(1.0, per_shard * max(window, platform.poll_interval))


def partition_caps(
    workload: Workload, design: Design, ops: Sequence[WriteOp], limits: Limits
) -> dict[str, float]:
    """Schedules/s per shard each hot key allows. A shard's steps move its schedules from
    ``HH:MM#shard`` to the next fire's bucket: one index write on each of the two keys per
    step. The largest tenant's ``by_tenant`` key takes its share of every active shard's
    steps (only while cursor updates write that index)."""
    active = min(design.groups, design.map_concurrency)
    caps: dict[str, float] = {}
    for op in ops:
        if op.key == "shard-minute":
            caps["due index key (minute#shard)"] = limits.partition_wcu / (op.units / 2)
        elif op.key == "tenant":
            caps["by_tenant key (largest tenant)"] = limits.partition_wcu / (
                op.units * workload.largest_tenant_share * active
            )
        elif op.key == "shard":
            caps["lease item (SHARD#n)"] = caps.get("lease item (SHARD#n)", INF)
            caps["lease item (SHARD#n)"] = min(
                caps["lease item (SHARD#n)"], limits.partition_wcu / op.units
            )
    return caps


def aws_scenario(
    workload: Workload,
    design: Design,
    platform: Platform,
    ops: Sequence[WriteOp],
    *,
    failed: bool,
) -> Scenario:
    limits = Limits()
    cap = min(partition_caps(workload, design, ops, limits).values(), default=INF)
    return Scenario(
        workload=workload,
        design=design,
        platform=platform,
        failed_group=0 if failed else None,
        rate_cap=cap,
        relay_capacity=relay_capacity(workload, design, platform, limits),
        relay_shards=stream_shards(workload),
    )


SHARD_CHOICES = (32, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640)
LOOKAHEAD_CHOICES = tuple(range(60, 601, 60))
MARGIN = 1.25  # the chosen N and L must also hold with every service time 25% longer


def slower(platform: Platform, factor: float) -> Platform:
    return replace(
        platform,
        transaction_seconds=platform.transaction_seconds * factor,
        page_seconds=platform.page_seconds * factor,
        write_seconds=platform.write_seconds * factor,
        plan_cpu=platform.plan_cpu * factor,
    )


@dataclass(frozen=True)
class Frontier:
    shards: int
    lookahead: int | None  # smallest L meeting the target, None: none up to 600 s
    p99: float
    with_margin: int | None  # the same with service times MARGIN times longer


def smallest_lookahead(
    workload: Workload,
    design: Design,
    platform: Platform,
    ops: Sequence[WriteOp],
    target: float,
    start: int = LOOKAHEAD_CHOICES[0],
) -> tuple[int | None, float]:
    """Bisection over LOOKAHEAD_CHOICES from ``start`` (a longer lookahead only adds time)."""
    choices = [lookahead for lookahead in LOOKAHEAD_CHOICES if lookahead >= start]
    best: tuple[int | None, float] = (None, INF)
    lo, hi = 0, len(choices) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = replace(design, lookahead=choices[mid])
        result = simulate(aws_scenario(workload, candidate, platform, ops, failed=True))
        if result.strict[2] <= target and result.flexible[2] <= target:
            best = (choices[mid], result.strict[2])
            hi = mid - 1
        else:
            lo = mid + 1
    return best


def search(
    workload: Workload,
    design: Design,
    platform: Platform,
    ops: Sequence[WriteOp],
    target: float = 1.0,
) -> tuple[list[Frontier], tuple[int, int] | None]:
    """For each N, the smallest L (a multiple of 60 s up to the config's 600 s) that keeps
    strict p99 <= ``target`` with one group failed and retried (and flexible occurrences
    within ``target`` of their available_at: the lookahead must not only save the strict
    ones by starving the minutes after :00), also with service times
    ``MARGIN`` times longer (the AWS latencies are assumptions). Chosen: the smallest N that
    meets it with the margin, at its smallest L with the margin."""
    frontier: list[Frontier] = []
    chosen: tuple[int, int] | None = None
    margin = slower(platform, MARGIN)
    for shards in SHARD_CHOICES:
        candidate = replace(design, shards=shards)
        lookahead, p99 = smallest_lookahead(workload, candidate, platform, ops, target)
        robust = None
        if lookahead is not None:
            robust, _ = smallest_lookahead(workload, candidate, margin, ops, target, lookahead)
        frontier.append(Frontier(shards, lookahead, p99, robust))
        if robust is not None and chosen is None:
            chosen = (shards, robust)
    return frontier, chosen

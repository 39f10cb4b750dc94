"""Capacity and cost model of Punctual at AWS scale (docs/capacity.md explains every input).

A discrete-event simulation of the top of the hour (EventBridge ticks, the Step Functions Map
over shard groups, materializer invocations with their timeout, leases, retries and the
shards each walks in turn, transactions of 49 schedule steps) followed by the stream and the
relay as a queue, with the per-operation costs measured locally (``make bench``,
``make bench-materializer``) and AWS latencies that are stated assumptions. It prints
schedule_lag p50/p95/p99 for strict and flexible occurrences, the busiest partitions, the
bottleneck, the smallest shard count N and lookahead L that keep strict p99 <= 1 s with one
shard group failed and retried, a cross-check against the local ``make bench`` run, and the
cost per million occurrences (scheduler path and worker SDK apart) before and after each cut
of the write path. Run: ``make capacity`` (options: ``--help``; stdlib only).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from punctual.materializer import LEASE_SECONDS

MINUTE = 60
PAGE_BYTES = 1024 * 1024  # a Query page returns at most 1 MB
KB = 1024
RCU_BYTES = 4 * 1024
FULL_VCPU_MB = 1769  # Lambda gives one full vCPU at 1,769 MB; CPU scales with memory
INF = math.inf

# The AWS pages each limit and price comes from (docs/capacity.md quotes them).
SOURCES = {
    "partition": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html",
    "on-demand": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/on-demand-capacity-mode.html",
    "gsi-writes": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/GSI.html#GSI.ThroughputConsiderations.Writes",
    "transactions": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html",
    "ddb-quotas": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html",
    "lambda-scaling": "https://docs.aws.amazon.com/lambda/latest/dg/scaling-behavior.html",
    "lambda-quotas": "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html",
    "lambda-ddb": "https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html",
    "lambda-ddb-params": "https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-params.html",
    "map-inline": "https://docs.aws.amazon.com/step-functions/latest/dg/state-map-inline.html",
    "sfn-quotas": "https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html",
    "sqs-quotas": "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html",
    "sqs-timers": "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-message-timers.html",
}


# --- prices and limits -------------------------------------------------------------------


@dataclass(frozen=True)
class Prices:
    """us-east-1 public list prices (USD), read 2026-11 from the pricing pages (docs)."""

    write_request: float = 0.625e-6  # DynamoDB on-demand, per write request unit
    read_request: float = 0.125e-6  # DynamoDB on-demand, per read request unit
    wcu_hour: float = 0.00065  # DynamoDB provisioned, per WCU-hour
    rcu_hour: float = 0.00013  # DynamoDB provisioned, per RCU-hour
    storage_gb_month: float = 0.25  # DynamoDB Standard table class
    pitr_gb_month: float = 0.20  # continuous backups (the data stack enables them)
    lambda_request: float = 0.20e-6
    lambda_gb_second: float = 0.0000133334  # arm64, first tier
    express_request: float = 1.00e-6  # Step Functions Express
    express_gb_second: float = 0.00001667  # Step Functions Express duration, first tier
    standard_transition: float = 0.025e-3  # Step Functions Standard
    sqs_request: float = 0.40e-6  # standard queue; each 64 KB chunk is a request
    log_gb: float = 0.50  # CloudWatch Logs ingestion (EMF metrics arrive as logs)
    metric_month: float = 0.30  # CloudWatch custom metric, first 10,000
    eventbridge_scheduler: float = 1.00e-6  # per invocation, after 14 M free a month


@dataclass(frozen=True)
class Limits:
    """AWS limits that bind (docs/capacity.md cites each page; keys of SOURCES)."""

    partition_wcu: float = 1000  # per partition (and so per key), write units/s [partition]
    partition_rcu: float = 3000  # per partition, read units/s [partition]
    table_wcu: float = 40_000  # on-demand table/GSI default, adjustable [on-demand]
    gsi_key_move_writes: int = 2  # delete + put when an index key changes [gsi-writes]
    transaction_factor: int = 2  # units per KB per item in a transaction [transactions]
    transaction_actions: int = 100  # [transactions]
    lambda_scale_per_10s: int = 1000  # new environments per function per 10 s [lambda-scaling]
    account_concurrency: int = 1000  # default regional concurrency, adjustable [lambda-quotas]
    stream_readers: int = 2  # processes per stream shard [ddb-quotas]
    parallelization_max: int = 10  # concurrent batches per stream shard [lambda-ddb-params]
    stream_polls_per_second: float = 4  # Lambda's poll rate per shard [lambda-ddb]
    map_concurrency_max: int = 40  # inline Map [map-inline]
    express_seconds: float = 300  # Express maximum duration [sfn-quotas]
    sqs_batch: int = 10  # [sqs-quotas]
    sqs_batch_bytes: int = 256 * 1024  # 256 KiB total per batch as the issue states [sqs-quotas]
    sqs_delay_max: int = 900  # [sqs-timers]


LIMIT_SOURCES = {
    "partition_wcu": "partition",
    "partition_rcu": "partition",
    "table_wcu": "on-demand",
    "gsi_key_move_writes": "gsi-writes",
    "transaction_factor": "transactions",
    "transaction_actions": "transactions",
    "lambda_scale_per_10s": "lambda-scaling",
    "account_concurrency": "lambda-quotas",
    "stream_readers": "ddb-quotas",
    "parallelization_max": "lambda-ddb-params",
    "stream_polls_per_second": "lambda-ddb",
    "map_concurrency_max": "map-inline",
    "express_seconds": "sfn-quotas",
    "sqs_batch": "sqs-quotas",
    "sqs_batch_bytes": "sqs-quotas",
    "sqs_delay_max": "sqs-timers",
}


# --- workload and design -------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    schedules: int = 20_000_000
    per_day: float = 200e6
    strict_peak: float = 500_000  # strict occurrences due at :00
    flexible_peak: float = 500_000  # flexible occurrences scheduled at :00 (assumption)
    flexible_window: int = 300  # their window spreads them over 5 minutes
    largest_tenant_share: float = 0.10  # of the :00 peak (assumption)
    tenants: int = 1000  # active tenants, one queue each (assumption)

    @property
    def background_per_second(self) -> float:
        """The rest of the day's occurrences, spread evenly (each hour's peak taken out)."""
        return max(0.0, (self.per_day - 24 * (self.strict_peak + self.flexible_peak)) / 86_400)

    def strict(self, bucket: int) -> float:
        return self.strict_peak if bucket == 0 else 0.0

    def flexible(self, bucket: int) -> float:
        minutes = max(1, self.flexible_window // MINUTE)
        return self.flexible_peak / minutes if 0 <= bucket < minutes else 0.0

    def uniform(self, bucket: int) -> float:
        """Schedules of a bucket whose available_at is spread over its minute."""
        return self.flexible(bucket) + self.background_per_second * MINUTE


@dataclass(frozen=True)
class Design:
    shards: int = 64  # N (cdk.json default)
    group_size: int = 8  # shards one materializer invocation walks in turn
    lookahead: int = 180  # L, seconds
    per_transaction: int = 49  # schedule steps per transaction: 2 actions each + the fence
    map_concurrency: int = 40
    relay_parallelization: int = 10
    sqs_batch: int = 10
    stream_batch: int = 500
    materializer_memory_mb: int = 1024
    relay_memory_mb: int = 1024
    relay_threads: int = 8

    @property
    def groups(self) -> int:
        return math.ceil(self.shards / self.group_size)


# --- how long things take ------------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """Service times. On AWS the call latencies are assumptions and ``plan_cpu``/``relay_cpu``
    the whole CPU time of our process per item measured locally; locally the latencies are
    measured per call (client CPU inside) and the CPU is what runs outside the calls."""

    transaction_seconds: float  # one TransactWriteItems of 2 * per_transaction + 1 actions
    page_seconds: float  # one Query page (1 MB) of the due index
    write_seconds: float  # one UpdateItem (lease claim, watermark, release)
    batch_get_seconds: float  # one BatchGetItem of up to 100 keys
    send_seconds: float  # one SendMessageBatch
    poll_seconds: float  # local poller: one GetRecords of 1,000 (Lambda's own on AWS)
    plan_cpu: float  # our CPU per schedule step
    relay_cpu: float  # our CPU per record relayed
    materializer_slowdown: float  # wall seconds per CPU second of our code
    relay_slowdown: float
    stream_delay: float  # commit -> record readable in the stream
    poll_interval: float  # the mapping polls each shard this often
    tick_delay: float = 1.0  # EventBridge + StartExecution + Map, after the minute
    invoke_seconds: float = 0.05  # a warm invocation
    cold_start: float = 1.0  # a retry lands on a new environment
    lambda_timeout: float = 55.0  # infra/materializer.py
    out_of_time: float = 10.0  # the handler's SAFETY_MILLIS
    lease_seconds: float = LEASE_SECONDS  # renewed while the walk goes on
    retry_intervals: tuple[float, ...] = (2.0, 4.0)  # Step Functions retry: 2 s, backoff 2
    execution_timeout: float = 90.0  # the Express state machine's timeout
    item_bytes: int = 750  # a schedule in the due index (ALL projection)

    def step_seconds(self, per_transaction: int) -> float:
        """Wall time of one transaction of ``per_transaction`` schedule steps."""
        return per_transaction * self.plan_cpu * self.materializer_slowdown + (
            self.transaction_seconds
        )

    def shard_rate(self, per_transaction: int) -> float:
        return per_transaction / self.step_seconds(per_transaction)

    def relay_batch_seconds(self, records: float, queues: float, threads: int) -> float:
        """One relay invocation: a BatchGetItem per 100, then per queue (``threads`` at a
        time) a SendMessageBatch per 10, in sequence (the send is not written back)."""
        records = max(1.0, records)
        queues = max(1.0, min(queues, records))
        per_queue = records / queues
        queue_seconds = math.ceil(per_queue / 10) * self.send_seconds
        return (
            math.ceil(records / 100) * self.batch_get_seconds
            + math.ceil(queues / threads) * queue_seconds
            + records * self.relay_cpu * self.relay_slowdown
        )


def aws_platform(design: Design, measured: LocalBench) -> Platform:
    """AWS latencies are assumptions (docs/capacity.md, "Service times"); CPU is measured."""
    return Platform(
        transaction_seconds=0.045,
        page_seconds=0.025,
        write_seconds=0.006,
        batch_get_seconds=0.010,
        send_seconds=0.015,
        poll_seconds=0.0,
        plan_cpu=measured.materialize_cpu / measured.schedules,
        relay_cpu=measured.relay_cpu / measured.schedules,
        materializer_slowdown=FULL_VCPU_MB / min(design.materializer_memory_mb, FULL_VCPU_MB),
        relay_slowdown=FULL_VCPU_MB / min(design.relay_memory_mb, FULL_VCPU_MB),
        stream_delay=0.5,
        poll_interval=1 / Limits().stream_polls_per_second,
    )


# --- the local measurement the model is calibrated on and checked against ----------------------


@dataclass(frozen=True)
class Calls:
    count: float
    wall: float  # seconds, summed over the calls
    cpu: float  # our thread's CPU inside the calls, summed


@dataclass(frozen=True)
class LocalBench:
    """``make bench`` (20,000 strict schedules, 4 tenants, 8 shards in 4 groups of 2, lookahead
    600 s), instrumented with ``python -m scripts.capacity --calibrate`` on 2026-11-30 02:52Z
    on this 2-core machine (DynamoDB Local in memory, moto SQS with the fix), write path as of
    the relay without the ENQUEUED mark (6.05 write units). Load average 1.06 after the run."""

    schedules: int = 20_000
    shards: int = 8
    group_size: int = 2
    lookahead: int = 600
    tenants: int = 4
    due_after_start: float = 200.0  # the due minute was about 200 s after materializing began
    host_cores: float = 2.0
    host_load: float = 1.06  # 1-minute load average at the end of the run (/proc/loadavg)
    # Measured outcomes (the cross-check compares the model with these).
    materialize_seconds: float = 32.28
    relay_seconds: float = 14.75
    lag_p50: float = 0.50
    lag_p95: float = 0.95
    lag_p99: float = 0.99
    polls: int = 20
    buckets_per_shard: int = 10  # the calibration prints 20 per group of 2 shards
    # Measured inputs: calls per phase and the CPU of our process per phase.
    transactions: Calls = Calls(412, 81.804, 3.972)
    query_pages: Calls = Calls(88, 20.343, 4.226)
    lease_writes: Calls = Calls(96, 1.464, 0.099)
    batch_gets: Calls = Calls(200, 2.043, 0.954)
    sends: Calls = Calls(2072, 29.382, 3.046)
    other_relay_calls: Calls = Calls(4, 0.007, 0.005)  # queue URL lookups
    relay_batches: int = 40
    relay_batch_wall: float = 11.216  # summed relay() calls; the rest of the polls is GetRecords
    materialize_cpu: float = 14.944
    relay_cpu: float = 7.795
    # The first, uninstrumented run (before the narrow projections, commit c081e75).
    before_write_units: float = 10.05
    before_materialize_seconds: float = 36.9
    before_relay_seconds: float = 48.7

    def local_platform(self) -> Platform:
        relay_calls = (self.batch_gets, self.sends, self.other_relay_calls)
        inside = self.transactions.cpu + self.query_pages.cpu + self.lease_writes.cpu
        return Platform(
            transaction_seconds=self.transactions.wall / self.transactions.count,
            page_seconds=self.query_pages.wall / self.query_pages.count,
            write_seconds=self.lease_writes.wall / self.lease_writes.count,
            batch_get_seconds=self.batch_gets.wall / self.batch_gets.count,
            send_seconds=self.sends.wall / self.sends.count,
            poll_seconds=(self.relay_seconds - self.relay_batch_wall) / self.polls,
            plan_cpu=(self.materialize_cpu - inside) / self.schedules,
            relay_cpu=(self.relay_cpu - sum(c.cpu for c in relay_calls)) / self.schedules,
            # A runnable thread gets about cores / load of a core on a loaded host.
            materializer_slowdown=max(1.0, self.host_load / self.host_cores),
            relay_slowdown=1.0,
            stream_delay=0.0,
            poll_interval=0.0,
            tick_delay=0.0,
            invoke_seconds=0.0,
            lambda_timeout=INF,
        )


MEASURED = LocalBench()
Q_LOCAL = 629.0  # make bench-materializer: occurrences/s per shard, one materializer (median)


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
    ``relay_parallelization`` batches at once, within the account's concurrency."""
    concurrency = min(
        stream_shards(workload) * design.relay_parallelization,
        limits.account_concurrency - design.map_concurrency,
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


# --- the write path as a table of operations ---------------------------------------------------


def units(size: int) -> int:
    return max(1, math.ceil(size / KB))


@dataclass(frozen=True)
class WriteOp:
    name: str
    table: str  # table or table.index
    key: str  # what the partition key spreads over: uniform | shard-minute | tenant | shard
    item_bytes: int
    factor: float = 1.0  # 2 inside a transaction, 2 for an index key move (delete + put)
    per_occurrence: float = 1.0

    @property
    def units_each(self) -> float:
        return units(self.item_bytes) * self.factor

    @property
    def units(self) -> float:
        return self.units_each * self.per_occurrence


def scheduler_ops(occurrence_bytes: int = 359, schedule_bytes: int = 750) -> list[WriteOp]:
    """The scheduler path (materialize -> queue) before the narrow projections: 10.05 write
    units per occurrence measured by ``make bench`` (commit c081e75)."""
    return [
        WriteOp("occurrence put (transactional)", "occurrences", "uniform", occurrence_bytes, 2),
        WriteOp("by_schedule index: occurrence added", "occurrences.by_schedule", "uniform", 359),
        WriteOp("cursor update (transactional)", "schedules", "uniform", schedule_bytes, 2),
        WriteOp(
            "due index: key moves (delete + put)",
            "schedules.due",
            "shard-minute",
            schedule_bytes,
            2,
        ),
        WriteOp(
            "by_tenant index: cursor attributes change (ALL)",
            "schedules.by_tenant",
            "tenant",
            schedule_bytes,
        ),
        WriteOp("ENQUEUED mark (UpdateItem)", "occurrences", "uniform", occurrence_bytes),
        WriteOp(
            "by_schedule index: state change (ALL)",
            "occurrences.by_schedule",
            "uniform",
            occurrence_bytes,
        ),
        WriteOp("fence check (2 per transaction of 49)", "leases", "shard", 100, 2, 1 / 49),
        WriteOp("lease claim, watermark, release", "leases", "shard", 100, 1, 0.01),
    ]


def without(ops: Sequence[WriteOp], *names: str) -> list[WriteOp]:
    missing = [n for n in names if not any(op.name.startswith(n) for op in ops)]
    if missing:
        raise ValueError(f"no such operation: {missing}")
    return [op for op in ops if not any(op.name.startswith(n) for n in names)]


# Each cut removes rows of the table: CUT_PROJECTIONS is commit 16c16b1 (by_tenant
# INCLUDE(state), by_schedule KEYS_ONLY); the other two are commits 3061b25 and after.
CUT_BY_TENANT = ("by_tenant index",)
CUT_BY_SCHEDULE_STATE = ("by_schedule index: state change",)
CUT_PROJECTIONS = CUT_BY_TENANT + CUT_BY_SCHEDULE_STATE
CUT_KEY_BY_SCHEDULE = ("by_schedule index: occurrence added",)
CUT_ENQUEUED = ("ENQUEUED mark",)
# Everything implemented: the write path as it is now (6.05, measured by make bench).
CUT_ALL = CUT_PROJECTIONS + CUT_KEY_BY_SCHEDULE + CUT_ENQUEUED


def scenarios(before: Sequence[WriteOp]) -> list[tuple[str, list[WriteOp]]]:
    return [
        ("before: ALL projections (measured 10.05)", list(before)),
        ("by_tenant projects state only", without(before, *CUT_BY_TENANT)),
        (
            "+ by_schedule keys only (16c16b1, measured 8.05)",
            without(before, *CUT_PROJECTIONS),
        ),
        (
            "+ occurrences keyed by schedule, no by_schedule index",
            without(before, *CUT_PROJECTIONS, *CUT_KEY_BY_SCHEDULE),
        ),
        (
            "+ no ENQUEUED mark (the claim records enqueued_at) = after, measured 6.05",
            without(before, *CUT_ALL),
        ),
    ]


WORKER_READS = (
    ("occurrence + schedule, strongly consistent (2 items)", 2.0),
    ("concurrency slot probe, 8 items eventually consistent", 4.0),
)


def worker_ops(narrow_projections: bool = True, overlap: bool = False) -> list[WriteOp]:
    """Worker SDK, one successful run (docs/worker.md, punctual/dal/runs.py)."""
    ops = [
        WriteOp("claim: occurrence -> RUNNING (transactional)", "occurrences", "uniform", 359, 2),
        WriteOp("claim: schedule version check (transactional)", "schedules", "uniform", 750, 2),
        WriteOp("claim: attempt record (transactional)", "occurrences", "uniform", 200, 2),
        WriteOp("claim: concurrency slot (transactional)", "tenants", "tenant", 200, 2),
        WriteOp("completion: occurrence -> SUCCEEDED (transactional)", "occurrences", "", 359, 2),
        WriteOp("completion: attempt outcome (transactional)", "occurrences", "uniform", 200, 2),
        WriteOp("slot release (UpdateItem)", "tenants", "tenant", 200),
    ]
    if not narrow_projections:
        ops.append(
            WriteOp("by_schedule index: 2 state changes (ALL)", "occurrences", "", 359, 1, 2)
        )
    if overlap:
        ops += [
            WriteOp("claim: run slot (transactional)", "schedules", "uniform", 200, 2),
            WriteOp("run slot release (UpdateItem)", "schedules", "uniform", 200),
        ]
    return ops


# --- cost per million occurrences ------------------------------------------------------------


@dataclass(frozen=True)
class CostInputs:
    workload: Workload
    design: Design
    platform: Platform
    shard_rate: float  # schedules/s one materializer commits (the simulation's)
    peak_rate: float  # schedules/s materialized at once at the top of the hour
    prices: Prices = Prices()
    limits: Limits = Limits()
    retention_days: int = 30
    occurrence_bytes: int = 359
    log_bytes_relay: int = 1_500  # START/END/REPORT + structured log + EMF per invocation
    log_bytes_materializer: int = 4_000
    handler_seconds: float = 0.005  # Powertools batch processing and metrics flush (assumption)
    custom_metrics: int = 40
    reconcile_reads_per_schedule_hour: float = 1.0  # history + occurrences queries, by_shard
    relay_window: float = 0.0  # the event source mapping's MaximumBatchingWindowInSeconds
    reconcile_cpu_per_schedule_hour: float = 0.002  # s at 1,769 MB (assumption)

    def materializer_busy_seconds(self) -> float:
        """A day's materializer invocation time: every occurrence at the shard rate, plus per
        shard and tick the lease claim, the watermark, the release and one empty page."""
        d, p = self.design, self.platform
        per_tick = d.shards * (3 * p.write_seconds + p.page_seconds)
        per_tick += d.groups * p.invoke_seconds
        return self.workload.per_day / self.shard_rate + 1440 * per_tick


Line = tuple[str, str, float]  # (group, line item, dollars per million occurrences)


def write_lines(ops: Sequence[WriteOp], prices: Prices) -> list[Line]:
    return [("DynamoDB writes", op.name, op.units * prices.write_request * 1e6) for op in ops]


def other_lines(c: CostInputs) -> list[Line]:
    """Everything on the scheduler path but the DynamoDB writes, on-demand."""
    pr, w, d, p = c.prices, c.workload, c.design, c.platform
    daily = w.per_day
    per_m = 1e6 / daily  # a daily amount -> per million occurrences
    ticks = 1440
    invocations = ticks * d.groups
    busy = c.materializer_busy_seconds()
    batch = average_batch(w, p, c.relay_window)
    queues = distinct_queues(batch, w.tenants)
    relay_seconds = p.relay_batch_seconds(batch, queues, d.relay_threads) + c.handler_seconds
    relay_gb = d.relay_memory_mb / 1024
    express_seconds = busy / invocations * math.ceil(d.groups / d.map_concurrency) + 1
    sends = queues / batch  # one SendMessageBatch per queue per batch (each under 64 KB)
    stored = w.per_day * c.retention_days * (c.occurrence_bytes + 100)  # no index since 3061b25
    schedule_hours = w.schedules * 24
    return [
        (
            "DynamoDB reads",
            "relay state check (BatchGetItem, 0.5 a record)",
            0.5 * pr.read_request * 1e6,
        ),
        (
            "DynamoDB reads",
            "due index Query (a schedule is 750 B of a 4 KB unit, 0.5)",
            p.item_bytes / RCU_BYTES * 0.5 * pr.read_request * 1e6,
        ),
        (
            "Lambda",
            f"materializer requests ({d.groups} a minute)",
            invocations * per_m * pr.lambda_request,
        ),
        (
            "Lambda",
            f"materializer GB-s ({d.materializer_memory_mb} MB)",
            busy * d.materializer_memory_mb / 1024 * per_m * pr.lambda_gb_second,
        ),
        (
            "Lambda",
            f"relay requests ({batch:.1f} records a batch)",
            pr.lambda_request / batch * 1e6,
        ),
        (
            "Lambda",
            f"relay GB-s ({d.relay_memory_mb} MB)",
            relay_seconds * relay_gb / batch * pr.lambda_gb_second * 1e6,
        ),
        ("Step Functions", "Express requests (1 a minute)", ticks * per_m * pr.express_request),
        (
            "Step Functions",
            f"Express duration ({express_seconds:.0f} s x 64 MB)",
            ticks * express_seconds * 0.0625 * per_m * pr.express_gb_second,
        ),
        ("SQS", f"SendMessageBatch ({sends:.2f} a message)", sends * pr.sqs_request * 1e6),
        (
            "CloudWatch",
            "Logs ingestion (relay + materializer, EMF metrics)",
            (c.log_bytes_relay / batch + c.log_bytes_materializer * invocations / daily)
            / 1e9
            * pr.log_gb
            * 1e6,
        ),
        (
            "CloudWatch",
            f"custom metrics ({c.custom_metrics})",
            c.custom_metrics * pr.metric_month / 30 * per_m,
        ),
        ("DynamoDB Streams", "GetRecords by the Lambda mapping (free)", 0.0),
        (
            "DynamoDB storage",
            f"occurrences kept {c.retention_days} days (no index copy)",
            stored / 1e9 * pr.storage_gb_month / 30 * per_m,
        ),
        (
            "DynamoDB storage",
            "point-in-time recovery (occurrences table)",
            stored / 1e9 * pr.pitr_gb_month / 30 * per_m,
        ),
        (
            "Reconciler (hourly)",
            "DynamoDB reads (history + occurrences per schedule)",
            schedule_hours * c.reconcile_reads_per_schedule_hour * per_m * pr.read_request,
        ),
        (
            "Reconciler (hourly)",
            "Lambda GB-s (1,769 MB)",
            schedule_hours
            * c.reconcile_cpu_per_schedule_hour
            * 1769
            / 1024
            * per_m
            * pr.lambda_gb_second,
        ),
        (
            "Reconciler (hourly)",
            "Step Functions Standard (Map + 2 a group + 3)",
            24 * (4 + 2 * d.groups) * per_m * pr.standard_transition,
        ),
    ]


def read_units_per_occurrence(c: CostInputs) -> float:
    return 0.5 + c.platform.item_bytes / RCU_BYTES * 0.5


def provisioned_capacity(
    c: CostInputs, ops: Sequence[WriteOp], *, utilization: float | None = None
) -> float:
    """Dollars per million occurrences of provisioned write and read capacity, per table and
    index: sized for the top-of-hour peak all day (``utilization`` None), or for the average
    at ``utilization`` (the peak then rides on burst capacity: not guaranteed)."""
    tables: dict[str, float] = {}
    for op in ops:
        tables[op.table] = tables.get(op.table, 0.0) + op.units
    average = c.workload.per_day / 86_400
    rate = c.peak_rate if utilization is None else average / utilization
    hourly = sum(max(1.0, rate * u) for u in tables.values()) * c.prices.wcu_hour
    hourly += rate * read_units_per_occurrence(c) * c.prices.rcu_hour
    return hourly * 24 / c.workload.per_day * 1e6


def worker_lines(prices: Prices, ops: Sequence[WriteOp]) -> list[Line]:
    lines = [("DynamoDB writes", op.name, op.units * prices.write_request * 1e6) for op in ops]
    lines += [("DynamoDB reads", what, u * prices.read_request * 1e6) for what, u in WORKER_READS]
    lines += [
        (
            "SQS",
            "ReceiveMessage + DeleteMessageBatch (10 a call) + ChangeMessageVisibility",
            1.2 * prices.sqs_request * 1e6,
        )
    ]
    return lines


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


# --- what binds at the peak ------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    what: str
    demand: float
    limit: float
    unit: str

    @property
    def utilization(self) -> float:
        return self.demand / self.limit if self.limit else INF


def partition_loads(
    workload: Workload, design: Design, ops: Sequence[WriteOp], result: SimResult
) -> list[Load]:
    """The busiest key of each kind, at the simulated rates."""
    limits = Limits()
    active = min(design.groups, design.map_concurrency)
    loads: list[Load] = []
    for op in ops:
        if op.key == "shard-minute":
            loads.append(
                Load(
                    "due index key HH:MM#shard (one shard's steps)",
                    result.shard_rate * op.units / 2,
                    limits.partition_wcu,
                    "WCU/s",
                )
            )
        elif op.key == "tenant":
            loads.append(
                Load(
                    f"by_tenant key of the largest tenant ({workload.largest_tenant_share:.0%})",
                    min(result.peak_rate, active * result.shard_rate)
                    * workload.largest_tenant_share
                    * op.units,
                    limits.partition_wcu,
                    "WCU/s",
                )
            )
    lease = sum(op.units for op in ops if op.key == "shard")
    loads.append(
        Load("lease item SHARD#n", result.shard_rate * lease, limits.partition_wcu, "WCU/s")
    )
    tables: dict[str, float] = {}
    for op in ops:
        tables[op.table] = tables.get(op.table, 0.0) + op.units
    for table, per_occurrence in sorted(tables.items()):
        loads.append(
            Load(
                f"table {table} (all partitions)",
                result.peak_rate * per_occurrence,
                limits.table_wcu,
                "WCU/s",
            )
        )
    partitions = stream_shards(workload)
    uniform = sum(
        op.units for op in ops if op.table.startswith("occurrences") and op.key == "uniform"
    )
    loads.append(
        Load(
            f"an occurrences partition (~{partitions} by size, keyed by schedule)",
            result.peak_rate * uniform / partitions,
            limits.partition_wcu,
            "WCU/s",
        )
    )
    return loads


def relay_concurrency(
    workload: Workload, design: Design, platform: Platform, rate: float
) -> tuple[float, float]:
    """(relay executions at ``rate`` records/s, seconds one batch takes): each stream shard
    hands a batch every poll; a batch longer than the poll interval overlaps the next."""
    shards = stream_shards(workload)
    records = min(design.stream_batch, max(1.0, rate * platform.poll_interval / shards))
    batch = platform.relay_batch_seconds(
        records, distinct_queues(records, workload.tenants), design.relay_threads
    )
    per_shard = min(design.relay_parallelization, max(1.0, batch / platform.poll_interval))
    busy = min(1.0, rate * platform.poll_interval / shards)  # shards with records each poll
    return shards * per_shard * busy, batch


def stage_loads(
    workload: Workload, design: Design, platform: Platform, result: SimResult
) -> list[Load]:
    """Demand and capacity of each stage at the peak. The materializer must walk the :00
    bucket and the buckets after it that the lookahead brings in before :00."""
    limits = Limits()
    active = min(design.groups, design.map_concurrency)
    buckets = max(1, design.lookahead // MINUTE)
    work = sum(workload.strict(m) + workload.uniform(m) for m in range(buckets))
    window = max(1.0, buckets * MINUTE - platform.tick_delay)
    peak_conc, _ = relay_concurrency(workload, design, platform, result.peak_rate)
    average_conc, _ = relay_concurrency(workload, design, platform, workload.per_day / 86_400)
    return [
        Load(
            f"materializer: the :00 bucket and {buckets - 1} more within L "
            f"({active} shards at once)",
            work / window,
            active * result.shard_rate,
            "schedules/s",
        ),
        Load(
            "relay: peak commit rate vs its capacity",
            result.peak_rate,
            relay_capacity(workload, design, platform, limits),
            "records/s",
        ),
        Load(
            "Step Functions inline Map: shard groups",
            design.groups,
            design.map_concurrency,
            "groups",
        ),
        Load(
            "Lambda concurrency: materializer + relay",
            active + peak_conc,
            limits.account_concurrency,
            "executions",
        ),
        Load(
            "Lambda scaling: relay ramp to the peak",
            max(0.0, peak_conc - average_conc),
            limits.lambda_scale_per_10s,
            "environments / 10 s",
        ),
    ]


# --- printing --------------------------------------------------------------------------------


def fmt(seconds: float) -> str:
    return "never" if seconds == INF else f"{seconds:.2f} s"


def print_lags(label: str, result: SimResult) -> None:
    s, f = result.strict, result.flexible
    print(
        f"  {label}: strict p50 {fmt(s[0])}, p95 {fmt(s[1])}, p99 {fmt(s[2])}; "
        f"flexible (past available_at) p50 {fmt(f[0])}, p95 {fmt(f[1])}, p99 {fmt(f[2])}"
    )
    print(
        f"    materialized {result.peak_rate:,.0f}/s at most ({result.shard_rate:,.0f}/s a shard), "
        f"first commit {result.first_commit:+.0f} s, last {result.materialize_end:+.0f} s; "
        f"{result.timeouts} invocations timed out, {result.leases_waited} claims met a live lease"
    )


def print_loads(title: str, loads: Sequence[Load]) -> Load:
    print(title)
    for load in sorted(loads, key=lambda x: -x.utilization):
        print(
            f"  {load.utilization:6.0%}  {load.what}: {load.demand:,.0f} of {load.limit:,.0f} "
            f"{load.unit}"
        )
    return max(loads, key=lambda x: x.utilization)


def print_costs(title: str, lines: Sequence[Line], *, detail: bool = True) -> float:
    print(title)
    groups: dict[str, float] = {}
    for group, item, dollars in lines:
        groups[group] = groups.get(group, 0.0) + dollars
        if detail:
            print(f"    ${dollars:7.3f}  {group}: {item}")
    total = sum(groups.values())
    for group, dollars in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  ${dollars:7.3f}  {group} ({dollars / total:.0%})")
    print(f"  ${total:7.3f}  total per million occurrences")
    return total


def report(args: argparse.Namespace) -> None:
    measured = MEASURED
    workload = Workload(
        strict_peak=args.strict,
        flexible_peak=args.flexible,
        largest_tenant_share=args.tenant_share,
    )
    design = Design(
        shards=args.shards,
        lookahead=args.lookahead,
        group_size=args.group_size,
        materializer_memory_mb=args.materializer_memory,
    )
    limits, prices = Limits(), Prices()
    platform = aws_platform(design, measured)
    before = scheduler_ops()
    after = without(before, *CUT_ALL)

    print("== Workload (one account and region)")
    print(
        f"  {workload.schedules:,} schedules, {workload.per_day:,.0f} occurrences a day "
        f"({workload.per_day / 86_400:,.0f}/s on average); at :00 {workload.strict_peak:,.0f} "
        f"strict and {workload.flexible_peak:,.0f} flexible spread over "
        f"{workload.flexible_window} s; the rest {workload.background_per_second:,.0f}/s evenly; "
        f"largest tenant {workload.largest_tenant_share:.0%} of the peak; "
        f"{workload.tenants:,} tenant queues"
    )
    print("== Design parameters")
    print(
        f"  N {design.shards} shards in groups of {design.group_size} "
        f"({design.groups} groups), L {design.lookahead} s, {design.per_transaction} schedules "
        f"a transaction, Map concurrency {design.map_concurrency}, relay parallelization "
        f"{design.relay_parallelization}, SQS batch {design.sqs_batch}, stream batch "
        f"{design.stream_batch}, materializer {design.materializer_memory_mb} MB"
    )
    print("== AWS limits used (docs/capacity.md cites the page of each)")
    for name, value in Limits().__dict__.items():
        print(f"  {name} = {value:,}  [{LIMIT_SOURCES[name]}]")
    for key in sorted(set(LIMIT_SOURCES.values())):
        print(f"  [{key}] {SOURCES[key]}")
    print("== Service times (AWS latencies assumed; CPU measured locally, scaled to Lambda)")
    print(
        f"  our CPU: {platform.plan_cpu * 1000:.2f} ms a schedule step, "
        f"{platform.relay_cpu * 1000:.2f} ms a relayed record (make bench), x"
        f"{platform.materializer_slowdown:.2f} at {design.materializer_memory_mb} MB; "
        f"TransactWriteItems {platform.transaction_seconds * 1000:.0f} ms, UpdateItem "
        f"{platform.write_seconds * 1000:.0f} ms, Query page "
        f"{platform.page_seconds * 1000:.0f} ms, "
        f"BatchGetItem {platform.batch_get_seconds * 1000:.0f} ms, SendMessageBatch "
        f"{platform.send_seconds * 1000:.0f} ms, stream {platform.stream_delay:.1f} s + polls "
        f"every {platform.poll_interval:.2f} s"
    )
    print(
        f"  -> one shard materializes {platform.shard_rate(design.per_transaction):,.0f} "
        f"schedules/s (locally, one materializer on DynamoDB Local: {Q_LOCAL:,.0f}/s)"
    )

    print(f"== Top of the hour, N {design.shards}, L {design.lookahead} s (write path after)")
    configured = simulate(aws_scenario(workload, design, platform, after, failed=False))
    print_lags("all groups healthy", configured)
    failing = simulate(aws_scenario(workload, design, platform, after, failed=True))
    print_lags("one group failed and retried", failing)

    chosen_design = design
    if not args.no_search:
        print("== Smallest N and L with strict p99 <= 1 s, one group failed and retried")
        frontier, chosen = search(workload, design, platform, after)
        for row in frontier:
            found = f"L {row.lookahead} s (p99 {row.p99:.2f} s)" if row.lookahead else "no L"
            margin = f"L {row.with_margin} s" if row.with_margin else "no L up to 600 s"
            groups = math.ceil(row.shards / design.group_size)
            print(
                f"  N {row.shards:4d} ({groups:3d} groups): {found}; "
                f"{MARGIN - 1:.0%} slower: {margin}"
            )
        if chosen is None:
            print("  no N up to the largest tried meets it")
        else:
            chosen_design = replace(design, shards=chosen[0], lookahead=chosen[1])
            print(
                f"  -> chosen: N {chosen[0]}, L {chosen[1]} s (the smallest N that meets it with "
                f"service times {MARGIN - 1:.0%} longer, at its smallest L)"
            )
    print(
        f"== At N {chosen_design.shards}, L {chosen_design.lookahead} s: lags, partitions, "
        "bottleneck"
    )
    healthy = simulate(aws_scenario(workload, chosen_design, platform, after, failed=False))
    failed = simulate(aws_scenario(workload, chosen_design, platform, after, failed=True))
    print_lags("all groups healthy", healthy)
    print_lags("one group failed and retried", failed)
    caps = partition_caps(workload, chosen_design, after, limits)
    binding = min(caps.items(), key=lambda kv: kv[1])
    print(
        f"  per-shard rate allowed by hot keys: {binding[1]:,.0f}/s ({binding[0]}); "
        f"with the ALL projection (before): "
        f"{min(partition_caps(workload, chosen_design, before, limits).values()):,.0f}/s"
    )
    busiest = print_loads(
        "Busiest partitions and tables at the peak (after)",
        partition_loads(workload, chosen_design, after, healthy),
    )
    print_loads(
        "  ... and before (by_tenant written on every step)",
        [
            load
            for load in partition_loads(workload, chosen_design, before, healthy)
            if "by_tenant" in load.what
        ],
    )
    stage = print_loads(
        "Stages at the peak", stage_loads(workload, chosen_design, platform, healthy)
    )
    print(
        f"  -> bottleneck stage: {stage.what} ({stage.utilization:.0%}); closest AWS limit: "
        f"{busiest.what} ({busiest.utilization:.0%})"
    )

    print("== Cross-check with the local make bench (20,000 strict, 8 shards in 4 groups)")
    checks, _ = cross_check(measured)
    for check in checks:
        tol = f"+-{check.tolerance:.2f} s" if check.absolute else f"+-{check.tolerance:.0%}"
        print(
            f"  {'ok  ' if check.ok else 'MISS'} {check.what}: predicted {check.predicted:,.2f}, "
            f"measured {check.measured:,.2f} ({tol})"
        )
    print(
        f"  engine-bound estimate from make bench-materializer's Q: "
        f"{measured.schedules / Q_LOCAL:.1f} s to materialize (an idle host: "
        f"{measured.before_materialize_seconds} s in the first run, before the narrow projections)"
    )
    print(
        "  measured figures: constants LocalBench (scripts/capacity.py), from "
        "`python -m scripts.capacity --calibrate`"
    )
    print(
        f"  {'all within tolerance' if all(c.ok for c in checks) else 'NOT all within tolerance'}"
    )

    inputs = CostInputs(
        workload=workload,
        design=chosen_design,
        platform=platform,
        shard_rate=healthy.shard_rate,
        peak_rate=healthy.peak_rate,
    )
    print(
        f"== Cost per million occurrences, scheduler path (us-east-1 list prices; N "
        f"{chosen_design.shards})"
    )
    other = other_lines(inputs)
    total_before = print_costs(
        f"-- before ({sum(op.units for op in before):.2f} WCU), on-demand",
        write_lines(before, prices) + other,
    )
    total_after = print_costs(
        f"-- after ({sum(op.units for op in after):.2f} WCU), on-demand",
        write_lines(after, prices) + other,
        detail=False,
    )
    print(
        "  largest cost driver: DynamoDB write units "
        f"({sum(op.units for op in before):.2f} an occurrence, "
        f"{sum(d for _, _, d in write_lines(before, prices)) / total_before:.0%} of the bill); "
        "the largest lines: the transactional occurrence put, the transactional cursor update "
        f"and the due index key move, ${2 * prices.write_request * 1e6:.2f} each"
    )
    rest = sum(d for _, _, d in other)
    reads = read_units_per_occurrence(inputs) * prices.read_request * 1e6
    print("-- scenarios: what each cut saves (the write path as a table of operations)")
    print(
        f"   WCU   writes  total: on-demand  provisioned for {inputs.peak_rate:,.0f}/s  "
        "provisioned at 70% of the average"
    )
    for label, ops in scenarios(before):
        units_ = sum(op.units for op in ops)
        writes = units_ * prices.write_request * 1e6
        peak = provisioned_capacity(inputs, ops) + rest - reads
        average = provisioned_capacity(inputs, ops, utilization=0.7) + rest - reads
        print(
            f"  {units_:5.2f}  ${writes:5.2f}  ${writes + rest:6.2f}            ${peak:6.2f}"
            f"                   ${average:6.2f}    {label}"
        )
    leaner = replace(inputs, relay_window=1.0, retention_days=7)
    rest_lean = sum(d for _, _, d in other_lines(leaner))
    per_unit = provisioned_capacity(
        inputs, [WriteOp("one unit", "t", "uniform", 100)], utilization=0.7
    )
    room = 1.00 - rest_lean
    print(
        f"  EventBridge parity ($1.00): everything but the writes costs ${rest:.2f} on its own "
        f"(${rest_lean:.2f} with a 1 s relay batching window and 7-day retention). Each write "
        f"unit an occurrence adds ${prices.write_request * 1e6:.3f} on demand, "
        f"${per_unit:.3f} provisioned at 70% of the average (the peak then rides on burst "
        f"capacity, which DynamoDB does not guarantee), so {sum(op.units for op in after):.2f} "
        f"WCU alone are ${sum(op.units for op in after) * per_unit:.2f} even provisioned. "
        + (
            f"Parity allows {room / per_unit:.1f} write units an occurrence provisioned: "
            if room > 0
            else "Parity is out of reach with any write path: "
        )
        + "it needs no durable item per occurrence (EventBridge Scheduler keeps none) and a "
        "relay that is not a Lambda invocation every few records."
    )
    worker = worker_ops()
    print_costs(
        f"== Worker SDK, one successful run (Punctual's tables, apart from the scheduler path): "
        f"{sum(op.units for op in worker):.0f} WCU after, "
        f"{sum(op.units for op in worker_ops(narrow_projections=False)):.0f} before, "
        f"+{sum(op.units for op in worker_ops(overlap=True)) - sum(op.units for op in worker):.0f} "
        "with SKIP_IF_RUNNING",
        worker_lines(prices, worker),
    )
    print(
        f"== Summary: strict p99 at 500k {fmt(healthy.strict[2])} (one group failed: "
        f"{fmt(failed.strict[2])}), N {chosen_design.shards}, L {chosen_design.lookahead} s, "
        f"bottleneck {stage.what.split(':')[0]} ({chosen_design.groups} groups x "
        f"{healthy.shard_rate:,.0f}/s a shard); scheduler path ${total_before:.2f}/M before, "
        f"${total_after:.2f}/M after (EventBridge Scheduler $1.00/M)"
    )


# --- calibration: make bench, instrumented -----------------------------------------------------


def calibrate(schedules: int) -> None:
    """Run the pipeline bench with every call timed per phase; prints the LocalBench figures.
    Loads the machine for about 6 minutes (as ``make bench``)."""
    import threading

    import scripts.bench_pipeline as bench
    from punctual.local.stats import percentile
    from punctual.local.streams import StreamPoller
    from punctual.materializer import Materializer, ShardReport
    from punctual.relay import Relay, RelayReport

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
        def relay(self, records: Any) -> RelayReport:
            phase[0] = "relay"
            records = list(records)
            wall = time.perf_counter()
            answer = super().relay(records)
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=Design.shards, help="N (code default 64)")
    parser.add_argument("--lookahead", type=int, default=Design.lookahead, help="L, seconds")
    parser.add_argument("--group-size", type=int, default=Design.group_size)
    parser.add_argument("--materializer-memory", type=int, default=Design.materializer_memory_mb)
    parser.add_argument("--strict", type=float, default=Workload.strict_peak)
    parser.add_argument("--flexible", type=float, default=Workload.flexible_peak)
    parser.add_argument("--tenant-share", type=float, default=Workload.largest_tenant_share)
    parser.add_argument("--no-search", action="store_true", help="skip the N/L search")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="run make bench instrumented (about 6 minutes) and print the measured figures",
    )
    args = parser.parse_args(argv)
    if args.calibrate:
        calibrate(20_000)
        return
    started = time.perf_counter()
    report(args)
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()

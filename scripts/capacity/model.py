"""The capacity model's inputs: prices and limits with their sources, the workload, the
design, the platform's service times, and the local measurement they are calibrated on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from punctual.pipeline.materializer import LEASE_SECONDS

MINUTE = 60
PAGE_BYTES = 1024 * 1024  # a Query page returns at most 1 MB
KB = 1024
RCU_BYTES = 4 * 1024
FULL_VCPU_MB = 1769  # Lambda gives one full vCPU at 1,769 MB; CPU scales with memory
INF = math.inf
HOURS_A_YEAR = 8760

# The AWS pages each limit and price comes from (docs/capacity.md quotes them).
SOURCES = {
    "partition": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html",
    "on-demand": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/on-demand-capacity-mode.html",
    "lambda-scaling": "https://docs.aws.amazon.com/lambda/latest/dg/scaling-behavior.html",
    "lambda-quotas": "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html",
    "lambda-ddb": "https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html",
    "reserved": "https://aws.amazon.com/dynamodb/pricing/provisioned/",
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
    # DynamoDB reserved capacity, 1-year term, Standard table class, per 100 units: a
    # partial upfront fee plus an hourly rate [reserved] (54% off the provisioned rates).
    reserved_wcu_upfront: float = 150.0
    reserved_wcu_hourly: float = 0.0128
    reserved_rcu_upfront: float = 30.0
    reserved_rcu_hourly: float = 0.0025

    @property
    def reserved_wcu_hour(self) -> float:
        """A reserved WCU-hour, its share of the upfront fee included."""
        return (self.reserved_wcu_upfront / HOURS_A_YEAR + self.reserved_wcu_hourly) / 100

    @property
    def reserved_rcu_hour(self) -> float:
        return (self.reserved_rcu_upfront / HOURS_A_YEAR + self.reserved_rcu_hourly) / 100

    @property
    def eventbridge_delivery(self) -> float:
        """EventBridge Scheduler's price of the same deliverable, a message in the tenant's
        queue at its time: the invocation plus its SendMessage, unbatched."""
        return self.eventbridge_scheduler + self.sqs_request


@dataclass(frozen=True)
class Limits:
    """AWS limits that bind (docs/capacity.md cites each page; keys of SOURCES)."""

    partition_wcu: float = 1000  # per partition (and so per key), write units/s [partition]
    table_wcu: float = 40_000  # on-demand table/GSI default, adjustable [on-demand]
    lambda_scale_per_10s: int = 1000  # new environments per function per 10 s [lambda-scaling]
    account_concurrency: int = 1000  # default regional concurrency, adjustable [lambda-quotas]
    stream_polls_per_second: float = 4  # Lambda's poll rate per shard [lambda-ddb]


LIMIT_SOURCES = {
    "partition_wcu": "partition",
    "table_wcu": "on-demand",
    "lambda_scale_per_10s": "lambda-scaling",
    "account_concurrency": "lambda-quotas",
    "stream_polls_per_second": "lambda-ddb",
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
    # Reserved concurrency (infra/config.py, cdk.json): the on-time relay's cap, the
    # catch-up lane's, the API's; the materializer's is derived from its groups.
    relay_concurrency: int = 400
    catchup_concurrency: int = 50
    api_concurrency: int = 100
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


# --- a write of the write path -----------------------------------------------------------


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

"""The write path as a table of operations, and the cost per million occurrences."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from punctual.integrations.streams import ON_TIME_WINDOW_SECONDS
from scripts.capacity.model import (
    RCU_BYTES,
    Design,
    Limits,
    Platform,
    Prices,
    Workload,
    WriteOp,
)
from scripts.capacity.simulation import average_batch, distinct_queues

# --- the write path as a table of operations ---------------------------------------------------


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
    ("the schedule's version again after the claim, strongly consistent", 1.0),
    ("concurrency slot probe, 8 items eventually consistent", 4.0),
)


def worker_ops(
    narrow_projections: bool = True, overlap: bool = False, folded: bool = True
) -> list[WriteOp]:
    """Worker SDK, one successful run (docs/worker.md, punctual/dal/runs.py). ``folded``:
    the attempt history on the occurrence item, no schedule version check, a single-item
    completion (2026-12-03); before, 13 units."""
    if folded:
        ops = [
            WriteOp(
                "claim: occurrence -> RUNNING + attempt (transactional)",
                "occurrences",
                "uniform",
                459,
                2,
            ),
            WriteOp("claim: concurrency slot (transactional)", "tenants", "tenant", 200, 2),
            WriteOp(
                "completion: occurrence -> SUCCEEDED + outcome (UpdateItem)", "occurrences", "", 459
            ),
            WriteOp("slot release (UpdateItem)", "tenants", "tenant", 200),
        ]
    else:
        ops = [
            WriteOp(
                "claim: occurrence -> RUNNING (transactional)", "occurrences", "uniform", 359, 2
            ),
            WriteOp(
                "claim: schedule version check (transactional)", "schedules", "uniform", 750, 2
            ),
            WriteOp("claim: attempt record (transactional)", "occurrences", "uniform", 200, 2),
            WriteOp("claim: concurrency slot (transactional)", "tenants", "tenant", 200, 2),
            WriteOp(
                "completion: occurrence -> SUCCEEDED (transactional)", "occurrences", "", 359, 2
            ),
            WriteOp(
                "completion: attempt outcome (transactional)", "occurrences", "uniform", 200, 2
            ),
            WriteOp("slot release (UpdateItem)", "tenants", "tenant", 200),
        ]
    if not narrow_projections:
        ops.append(
            WriteOp("by_schedule index: 2 state changes (ALL)", "occurrences", "", 359, 1, 2)
        )
    if overlap:
        ops += [
            WriteOp("claim: run slot (transactional)", "tenants", "uniform", 200, 2),
            WriteOp("run slot release (UpdateItem)", "tenants", "uniform", 200),
        ]
    return ops


# --- cost per million occurrences ------------------------------------------------------------


# The hourly reconciler per schedule-hour, measured by `make bench-reconciler` on this 2-core
# machine, loaded: 0.61 read units and 3.6 ms on 2026-12-03 (1.0 and 2 ms were assumed
# before); 0.31 and 1.0 ms since the occurrences of a schedule owning no fire in the hour
# are not read (2026-12-03, ownership.idle); 0.56 ms since items are parsed as sent
# (punctual.dal.responses, the same day).
RECONCILE_READS = 0.31  # by_shard pages + occurrence queries
RECONCILE_CPU = 0.0006  # s at 1,769 MB (one vCPU)
RECONCILE_BEFORE = (0.61, 0.0036)  # reads, CPU: every schedule read, botocore's parser


@dataclass(frozen=True)
class CostInputs:
    workload: Workload
    design: Design
    platform: Platform
    shard_rate: float  # schedules/s one materializer commits (the simulation's)
    peak_rate: float  # schedules/s materialized at once at the top of the hour
    prices: Prices = field(default_factory=Prices)
    limits: Limits = field(default_factory=Limits)
    retention_days: int = 30
    occurrence_bytes: int = 359
    log_bytes_relay: int = 1_500  # START/END/REPORT + structured log + EMF per invocation
    log_bytes_materializer: int = 4_000
    handler_seconds: float = 0.005  # Powertools batch processing and metrics flush (assumption)
    custom_metrics: int = 40
    # The on-time mapping's MaximumBatchingWindowInSeconds, as deployed (0 until 2026-12-03).
    relay_window: float = ON_TIME_WINDOW_SECONDS
    # Occurrences made less than the window before their time (a run now, a one-shot due in
    # a moment), which the API also sends at once: one more SendMessage each (assumption).
    prompt_share: float = 0.01
    reconcile_reads_per_schedule_hour: float = RECONCILE_READS
    reconcile_cpu_per_schedule_hour: float = RECONCILE_CPU

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


@dataclass(frozen=True)
class Billing:
    """How DynamoDB capacity is bought: on demand (per request unit), or provisioned with
    autoscaling that keeps ``utilization`` of it busy on average, at the provisioned or the
    1-year reserved rates (per unit-hour; None: on demand)."""

    name: str
    wcu_hour: float | None = None
    rcu_hour: float | None = None
    utilization: float = 0.7

    def write_unit(self, prices: Prices) -> float:
        """Dollars per write unit an occurrence uses."""
        if self.wcu_hour is None:
            return prices.write_request
        return self.wcu_hour / (self.utilization * 3600)

    def read_unit(self, prices: Prices) -> float:
        if self.rcu_hour is None:
            return prices.read_request
        return self.rcu_hour / (self.utilization * 3600)


def billings(prices: Prices) -> list[Billing]:
    return [
        Billing("on demand"),
        Billing("provisioned", prices.wcu_hour, prices.rcu_hour),
        Billing("reserved 1-year", prices.reserved_wcu_hour, prices.reserved_rcu_hour),
    ]


def bill(c: CostInputs, ops: Sequence[WriteOp], billing: Billing) -> list[Line]:
    """The scheduler path's bill per million occurrences, DynamoDB bought as ``billing``."""
    write = billing.write_unit(c.prices)
    writes = [("DynamoDB writes", op.name, op.units * write * 1e6) for op in ops]
    return writes + other_lines(c, read_price=billing.read_unit(c.prices))


def other_lines(c: CostInputs, read_price: float | None = None) -> list[Line]:
    """Everything on the scheduler path but the DynamoDB writes; DynamoDB reads at
    ``read_price`` a unit (on demand by default)."""
    pr, w, d, p = c.prices, c.workload, c.design, c.platform
    read = pr.read_request if read_price is None else read_price
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
            "due index Query (a schedule is 750 B of a 4 KB unit, 0.5)",
            p.item_bytes / RCU_BYTES * 0.5 * read * 1e6,
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
            "SQS",
            f"the API's prompt sends ({c.prompt_share:.0%} of occurrences, assumption)",
            c.prompt_share * pr.sqs_request * 1e6,
        ),
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
            schedule_hours * c.reconcile_reads_per_schedule_hour * per_m * read,
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
    """The due index Query's share (the relay reads nothing since 2026-11-30)."""
    return c.platform.item_bytes / RCU_BYTES * 0.5


def provisioned_capacity(c: CostInputs, ops: Sequence[WriteOp]) -> float:
    """Dollars per million occurrences of provisioned write and read capacity, per table and
    index, sized for the top-of-hour peak all day (capacity kept busy on average, the
    autoscaled way, is ``bill`` with a provisioned ``Billing``)."""
    tables: dict[str, float] = {}
    for op in ops:
        tables[op.table] = tables.get(op.table, 0.0) + op.units
    rate = c.peak_rate
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

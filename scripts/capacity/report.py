"""What binds at the peak, and the printed report."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from infra.config import TICKER_TIMEOUT_SECONDS, UNRESERVED_MINIMUM
from scripts.capacity.calibration import cross_check
from scripts.capacity.cost import (
    CUT_ALL,
    RECONCILE_BEFORE,
    Billing,
    CostInputs,
    Line,
    bill,
    billings,
    other_lines,
    provisioned_capacity,
    read_units_per_occurrence,
    scenarios,
    scheduler_ops,
    without,
    worker_lines,
    worker_ops,
    write_lines,
)
from scripts.capacity.ledger import print_ledger
from scripts.capacity.model import (
    INF,
    LIMIT_SOURCES,
    MEASURED,
    MINUTE,
    Q_LOCAL,
    SOURCES,
    Design,
    Limits,
    LocalBench,
    Platform,
    Prices,
    Workload,
    WriteOp,
    aws_platform,
    units,
)
from scripts.capacity.payloads import ITEM_SIZE, payload_rows
from scripts.capacity.simulation import (
    MARGIN,
    SimResult,
    average_batch,
    aws_scenario,
    distinct_queues,
    partition_caps,
    relay_capacity,
    search,
    simulate,
    stream_shards,
)

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


def reserved_concurrency(design: Design) -> int:
    """What the stack reserves (DeployConfig.reserved_concurrency): every materializer
    group of the ticks that may overlap, the API, both relay lanes."""
    groups = min(design.groups, design.map_concurrency)
    materializer = math.ceil(TICKER_TIMEOUT_SECONDS / MINUTE) * groups
    return (
        materializer
        + design.api_concurrency
        + design.relay_concurrency
        + design.catchup_concurrency
    )


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
            "relay: executions at the peak vs its reservation (relay_concurrency)",
            peak_conc,
            design.relay_concurrency,
            "executions",
        ),
        Load(
            "Lambda concurrency: reservations + Lambda's 100 unreserved",
            reserved_concurrency(design) + UNRESERVED_MINIMUM,
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


def total(lines: Sequence[Line]) -> float:
    return sum(dollars for _, _, dollars in lines)


def print_bill(
    title: str, bills: Sequence[Sequence[Line]], names: Sequence[str], rival: float
) -> list[float]:
    """Each line of the bill, one column per way of buying capacity, then each group, the
    totals, and how far each is from ``rival`` (dollars an occurrence)."""
    print(title)

    def row(cells: Sequence[str], what: str) -> None:
        print("  " + "".join(f"{cell:>16}" for cell in cells) + f"   {what}")

    row(names, "")
    for lines in zip(*bills, strict=True):
        group, item, _ = lines[0]
        row([f"${d:.3f}" for _, _, d in lines], f"{group}: {item}")
    for group in dict.fromkeys(group for group, _, _ in bills[0]):
        row([f"${sum(d for g, _, d in lines if g == group):.3f}" for lines in bills], group)
    totals = [total(lines) for lines in bills]
    row([f"${d:.3f}" for d in totals], "total per million occurrences")
    row(
        [f"{d / (rival * 1e6):.2f}x" for d in totals],
        f"of EventBridge Scheduler's ${rival * 1e6:.2f} (its invocation and SendMessage)",
    )
    return totals


def print_payloads(
    shard_rate: float, limits: Limits, prices: Prices, platform: Platform, design: Design
) -> None:
    """A step's units by payload size: the due index's busiest key against the partition
    limit, the cursor update, the reads; before (the payload in the CURRENT item, so in its
    due index entry) and now (in the version item alone)."""
    print(
        f"== Payloads: a step's due index writes on the busiest key HH:00#shard "
        f"({shard_rate:,.0f} steps/s a shard, one entry leaving it per step), before (payload "
        "in the CURRENT item, so in the due entry, ALL) -> now (in the version item alone) "
        f"[{ITEM_SIZE}]"
    )
    print(
        f"  {'payload':>8}  {'due entry, bytes':>16}  {'busiest due key, WCU/s':>26}  "
        f"{'cursor update':>13}  {'by_shard entry':>14}  reads a step, RRU: due Query + version"
    )
    for row in payload_rows():
        before, after = row.current_before, row.current_after
        key = [shard_rate * row.index_units(size) for size in (before, after)]
        use = [k / limits.partition_wcu for k in key]
        reads = [row.query_read_units(before), row.query_read_units(after)]
        print(
            f"  {row.payload:6,d} B  {before:7,d} -> {after:5,d}  "
            f"{key[0]:7,.0f} ({use[0]:5.0%}) -> {key[1]:4,.0f} ({use[1]:3.0%})  "
            f"{row.cursor_units(before):4d} -> {row.cursor_units(after)} WCU  "
            f"{row.shard_before:6,d} -> {row.shard_after:4,d}  "
            f"{reads[0]:.2f} -> {reads[1]:.2f} + {row.payload_read_units:.1f}"
        )
    largest = payload_rows()[-1]
    writes = [
        2 * largest.index_units(size) + largest.cursor_units(size)
        for size in (largest.current_before, largest.current_after)
    ]
    reads = [
        largest.query_read_units(largest.current_before),
        largest.query_read_units(largest.current_after) + largest.payload_read_units,
    ]
    was = shard_rate * units(largest.current_before)
    fetching = replace(
        platform,
        transaction_seconds=platform.transaction_seconds
        + platform.batch_get_seconds * design.per_transaction / 100,
    )
    print(
        f"  -> now {shard_rate * units(largest.current_after):,.0f} of "
        f"{limits.partition_wcu:,.0f} WCU/s whatever the payload; with {largest.payload:,} B "
        f"payloads it was {was:,.0f} ({was / limits.partition_wcu:.0f}x the limit: a throttled "
        "index throttles the step's transaction). A step with a payload now reads its version "
        "item, eventually consistent (its size / 4 KB rounded up, halved; read again "
        "consistently only when a replica has not got it yet), in one BatchGetItem per 100 "
        f"steps ({platform.batch_get_seconds * 1000:.0f} ms assumed: a shard steps "
        f"{fetching.shard_rate(design.per_transaction):,.0f}/s instead of "
        f"{platform.shard_rate(design.per_transaction):,.0f}/s when every schedule has a "
        f"payload, which the simulation above leaves out). At {largest.payload:,} B a step "
        f"writes {writes[0]} -> {writes[1]} units (the cursor update and the due key move) and "
        f"reads {reads[0]:.2f} -> {reads[1]:.2f}: "
        f"${(writes[0] - writes[1]) * prices.write_request * 1e6:,.2f} less and "
        f"${(reads[1] - reads[0]) * prices.read_request * 1e6:.2f} more a million on demand. "
        "The occurrence put still carries the payload (the relay sends from its stream record)."
    )


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
    prices = Prices()
    platform = aws_platform(design, measured)
    before = scheduler_ops()
    after = without(before, *CUT_ALL)

    print_inputs(workload, design, platform)
    print(f"== Top of the hour, N {design.shards}, L {design.lookahead} s (write path after)")
    configured = simulate(aws_scenario(workload, design, platform, after, failed=False))
    print_lags("all groups healthy", configured)
    failing = simulate(aws_scenario(workload, design, platform, after, failed=True))
    print_lags("one group failed and retried", failing)
    chosen_design = design if args.no_search else chosen(workload, design, platform, after)
    healthy, failed, stage = print_peak(workload, chosen_design, platform, before, after, prices)
    print_cross_check(measured)
    inputs = CostInputs(
        workload=workload,
        design=chosen_design,
        platform=platform,
        shard_rate=healthy.shard_rate,
        peak_rate=healthy.peak_rate,
    )
    total_before, totals = print_scheduler_costs(inputs, before, after, prices)
    print_worker_costs(prices)
    print_ledger(workload, chosen_design)
    print(
        f"== Summary: strict p99 at 500k {fmt(healthy.strict[2])} (one group failed: "
        f"{fmt(failed.strict[2])}), N {chosen_design.shards}, L {chosen_design.lookahead} s, "
        f"bottleneck {stage.what.split(':')[0]} ({chosen_design.groups} groups x "
        f"{healthy.shard_rate:,.0f}/s a shard); scheduler path ${total_before:.2f}/M before, "
        f"${totals[0]:.2f}/M after on demand, ${totals[1]:.2f} provisioned, "
        f"${totals[2]:.2f} reserved (EventBridge Scheduler "
        f"${prices.eventbridge_delivery * 1e6:.2f}/M with its SendMessage)"
    )


def print_inputs(workload: Workload, design: Design, platform: Platform) -> None:
    """The workload, the design's parameters, the AWS limits and the service times."""
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


def chosen(
    workload: Workload, design: Design, platform: Platform, after: Sequence[WriteOp]
) -> Design:
    """The smallest N (and its smallest L) that keeps strict p99 within 1 s with one group
    failed and retried, under service times ``MARGIN`` longer; ``design`` if none does."""
    print("== Smallest N and L with strict p99 <= 1 s, one group failed and retried")
    frontier, found = search(workload, design, platform, after)
    for row in frontier:
        meets = f"L {row.lookahead} s (p99 {row.p99:.2f} s)" if row.lookahead else "no L"
        margin = f"L {row.with_margin} s" if row.with_margin else "no L up to 600 s"
        groups = math.ceil(row.shards / design.group_size)
        print(
            f"  N {row.shards:4d} ({groups:3d} groups): {meets}; {MARGIN - 1:.0%} slower: {margin}"
        )
    if found is None:
        print("  no N up to the largest tried meets it")
        return design
    print(
        f"  -> chosen: N {found[0]}, L {found[1]} s (the smallest N that meets it with "
        f"service times {MARGIN - 1:.0%} longer, at its smallest L)"
    )
    return replace(design, shards=found[0], lookahead=found[1])


def print_peak(
    workload: Workload,
    design: Design,
    platform: Platform,
    before: Sequence[WriteOp],
    after: Sequence[WriteOp],
    prices: Prices,
) -> tuple[SimResult, SimResult, Load]:
    """At ``design``: the lags (healthy, and one group failed), the hot keys, the busiest
    partitions and tables, the stages and the payloads; the two simulations' results and
    the bottleneck stage."""
    limits = Limits()
    print(f"== At N {design.shards}, L {design.lookahead} s: lags, partitions, bottleneck")
    healthy = simulate(aws_scenario(workload, design, platform, after, failed=False))
    failed = simulate(aws_scenario(workload, design, platform, after, failed=True))
    print_lags("all groups healthy", healthy)
    print_lags("one group failed and retried", failed)
    caps = partition_caps(workload, design, after, limits)
    binding = min(caps.items(), key=lambda kv: kv[1])
    print(
        f"  per-shard rate allowed by hot keys: {binding[1]:,.0f}/s ({binding[0]}); "
        f"with the ALL projection (before): "
        f"{min(partition_caps(workload, design, before, limits).values()):,.0f}/s"
    )
    busiest = print_loads(
        "Busiest partitions and tables at the peak (after)",
        partition_loads(workload, design, after, healthy),
    )
    print_loads(
        "  ... and before (by_tenant written on every step)",
        [
            load
            for load in partition_loads(workload, design, before, healthy)
            if "by_tenant" in load.what
        ],
    )
    stage = print_loads("Stages at the peak", stage_loads(workload, design, platform, healthy))
    print(
        f"  -> bottleneck stage: {stage.what} ({stage.utilization:.0%}); closest AWS limit: "
        f"{busiest.what} ({busiest.utilization:.0%})"
    )
    print_payloads(healthy.shard_rate, limits, prices, platform, design)
    return healthy, failed, stage


def print_cross_check(measured: LocalBench) -> None:
    """The model against the local make bench it is calibrated on."""
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
        "  measured figures: constants LocalBench (scripts/capacity/model.py), from "
        "`python -m scripts.capacity --calibrate`"
    )
    print(
        f"  {'all within tolerance' if all(c.ok for c in checks) else 'NOT all within tolerance'}"
    )


def print_scheduler_costs(
    inputs: CostInputs, before: Sequence[WriteOp], after: Sequence[WriteOp], prices: Prices
) -> tuple[float, list[float]]:
    """The scheduler path's cost per million occurrences: before the cuts on demand, after
    them bought three ways, what each cut saves and how far EventBridge's parity is; the
    total before, and the totals after (on demand, provisioned, reserved)."""
    print(
        f"== Cost per million occurrences, scheduler path (us-east-1 list prices; N "
        f"{inputs.design.shards})"
    )
    other = other_lines(inputs)
    total_before = print_costs(
        f"-- before ({sum(op.units for op in before):.2f} WCU), on demand",
        write_lines(before, prices) + other,
        detail=False,
    )
    print(
        "  largest cost driver: DynamoDB write units "
        f"({sum(op.units for op in before):.2f} an occurrence, "
        f"{sum(d for _, _, d in write_lines(before, prices)) / total_before:.0%} of the bill); "
        "the largest lines: the transactional occurrence put, the transactional cursor update "
        f"and the due index key move, ${2 * prices.write_request * 1e6:.2f} each"
    )
    ways = billings(prices)
    totals = print_bill(
        f"-- after ({sum(op.units for op in after):.2f} WCU): the bill, DynamoDB bought three "
        "ways (provisioned: autoscaling keeps 70% of it busy on average, the top of the "
        "hour rides on burst capacity, which DynamoDB does not guarantee; reserved: the "
        "same capacity at the 1-year reserved rates, upfront fee spread over the year)",
        [bill(inputs, after, way) for way in ways],
        [way.name for way in ways],
        prices.eventbridge_delivery,
    )
    print_scenarios(inputs, before, other, prices, ways)
    print_relay_window(inputs, other)
    print_reconciler_saving(inputs, prices, ways)
    print_parity(inputs, after, prices, ways)
    return total_before, totals


def print_scenarios(
    inputs: CostInputs,
    before: Sequence[WriteOp],
    other: Sequence[Line],
    prices: Prices,
    ways: Sequence[Billing],
) -> None:
    """What each cut of the write path saves, on every way of buying capacity."""
    rest = sum(d for _, _, d in other)
    reads = read_units_per_occurrence(inputs) * prices.read_request * 1e6
    print("-- scenarios: what each cut saves (the write path as a table of operations)")
    print(
        f"   WCU   writes  total: on demand  provisioned for {inputs.peak_rate:,.0f}/s  "
        "provisioned at 70%  reserved at 70%"
    )
    for label, ops in scenarios(before):
        units_ = sum(op.units for op in ops)
        writes = units_ * prices.write_request * 1e6
        peak = provisioned_capacity(inputs, ops) + rest - reads
        provisioned, reserved = (total(bill(inputs, ops, way)) for way in ways[1:])
        print(
            f"  {units_:5.2f}  ${writes:5.2f}  ${writes + rest:6.2f}           ${peak:6.2f}"
            f"                  ${provisioned:6.2f}              ${reserved:6.2f}   {label}"
        )


def print_relay_window(inputs: CostInputs, other: Sequence[Line]) -> None:
    """What the relay's batching window saves."""
    workload, platform = inputs.workload, inputs.platform
    unbatched = replace(inputs, relay_window=0.0, prompt_share=0.0)
    was, now = other_lines(unbatched), other
    cuts = [(b[1], b[2] - a[2]) for b, a in zip(was, now, strict=True) if b[2] != a[2]]
    print(
        f"  the relay's {inputs.relay_window:.0f} s batching window (built 2026-12-03): "
        f"{average_batch(workload, platform, 0.0):.1f} -> "
        f"{average_batch(workload, platform, inputs.relay_window):.1f} records an invocation, "
        f"${total(was) - total(now):.3f} less a million on every column: "
        + "; ".join(f"{name} {-saved:+.3f}" for name, saved in cuts)
    )


def print_reconciler_saving(inputs: CostInputs, prices: Prices, ways: Sequence[Billing]) -> None:
    """What the reconciler's cheaper check of a schedule-hour saves."""
    reads, cpu = RECONCILE_BEFORE
    every = replace(
        inputs, reconcile_reads_per_schedule_hour=reads, reconcile_cpu_per_schedule_hour=cpu
    )
    saved = [
        total(other_lines(every, read_price=way.read_unit(prices)))
        - total(other_lines(inputs, read_price=way.read_unit(prices)))
        for way in ways
    ]
    print(
        "  the reconciler (built 2026-12-03: idle schedules unread, items parsed as sent): "
        f"{reads} -> {inputs.reconcile_reads_per_schedule_hour} read "
        f"units and {cpu * 1000:.1f} -> {inputs.reconcile_cpu_per_schedule_hour * 1000:.1f} ms "
        "a schedule-hour (make bench-reconciler), "
        + ", ".join(
            f"${cut:.3f} less a million {way.name}" for cut, way in zip(saved, ways, strict=True)
        )
    )


def print_parity(
    inputs: CostInputs, after: Sequence[WriteOp], prices: Prices, ways: Sequence[Billing]
) -> None:
    """How many write units an occurrence may take for EventBridge Scheduler's price."""
    leaner = replace(inputs, retention_days=7)
    reserved_way = ways[-1]
    rest_lean = total(other_lines(leaner, read_price=reserved_way.read_unit(prices)))
    per_unit = reserved_way.write_unit(prices) * 1e6
    target = prices.eventbridge_delivery * 1e6
    room = target - rest_lean
    after_units = sum(op.units for op in after)
    print(
        f"  EventBridge parity (${target:.2f}: its invocation and its SendMessage to the "
        f"queue): everything but the writes costs ${total(bill(inputs, [], reserved_way)):.2f} "
        f"reserved (${rest_lean:.2f} with 7-day retention, a setting: "
        f"${rest_lean + after_units * per_unit:.2f} in all). "
        f"Each write unit an occurrence adds ${prices.write_request * 1e6:.3f} on demand, "
        f"${ways[1].write_unit(prices) * 1e6:.3f} provisioned, ${per_unit:.3f} reserved, so "
        f"{after_units:.2f} WCU alone are ${after_units * per_unit:.2f} reserved. "
        + (
            f"Parity allows {room / per_unit:.1f} write units an occurrence, reserved, with "
            "that setting (docs/capacity.md, the gap line by line)."
            if room > 0
            else "Parity is out of reach with any write path (docs/capacity.md)."
        )
    )


def print_worker_costs(prices: Prices) -> None:
    """One successful run of the worker SDK, in write units and dollars."""
    worker = worker_ops()
    print_costs(
        f"== Worker SDK, one successful run (Punctual's tables, apart from the scheduler path): "
        f"{sum(op.units for op in worker):.0f} WCU now, "
        f"{sum(op.units for op in worker_ops(folded=False)):.0f} before the attempt fold, "
        f"{sum(op.units for op in worker_ops(folded=False, narrow_projections=False)):.0f} "
        "before the narrow projections, "
        f"+{sum(op.units for op in worker_ops(overlap=True)) - sum(op.units for op in worker):.0f} "
        "with SKIP_IF_RUNNING",
        worker_lines(prices, worker),
    )

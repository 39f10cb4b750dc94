"""The capacity model's building blocks (scripts/capacity/): lags, transactions, the
simulated materializer (groups, leases, timeouts, failures), the relay queue, the write path
as a table of operations, and the cross-check against the local bench. Simulated time only."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scripts.capacity.calibration import Check, cross_check
from scripts.capacity.cost import (
    CUT_ALL,
    CUT_PROJECTIONS,
    CostInputs,
    bill,
    billings,
    other_lines,
    scheduler_ops,
    without,
    write_lines,
)
from scripts.capacity.ledger import BUDGET, costs, page_units
from scripts.capacity.model import (
    INF,
    MEASURED,
    Design,
    Limits,
    Platform,
    Prices,
    Workload,
    aws_platform,
)
from scripts.capacity.payloads import SIZES, item_bytes, payload_rows
from scripts.capacity.simulation import (
    LagHistogram,
    Piece,
    Scenario,
    Simulation,
    aws_scenario,
    partition_caps,
    receivable_lag,
    simulate,
)


def platform(lambda_timeout: float = 55.0) -> Platform:
    """A simple platform: 0.5 s a transaction of 49, no CPU, quick writes and pages."""
    return Platform(
        transaction_seconds=0.5,
        page_seconds=0.01,
        write_seconds=0.01,
        batch_get_seconds=0.01,
        send_seconds=0.01,
        poll_seconds=0.0,
        plan_cpu=0.0,
        relay_cpu=0.0,
        materializer_slowdown=1.0,
        relay_slowdown=1.0,
        stream_delay=0.0,
        poll_interval=0.0,
        tick_delay=0.0,
        invoke_seconds=0.0,
        cold_start=0.0,
        lambda_timeout=lambda_timeout,
    )


def strict_only(count: float) -> Workload:
    return Workload(strict_peak=count, flexible_peak=0, per_day=24 * count)


def test_receivable_lag_rounds_the_delay_up_to_a_whole_second() -> None:
    # GIVEN a message sent 0.3 s before its instant, and one sent 2 s after
    # WHEN the lag is taken as SQS makes it receivable (DelaySeconds = ceil)
    early, late = receivable_lag(-0.3, 0.0), receivable_lag(2.0, 0.0)
    # THEN the early one is receivable 0.7 s late (never early), the late one 2 s late
    assert early == pytest.approx(0.7)
    assert late == pytest.approx(2.0)


def test_lag_histogram_percentiles_follow_the_weights() -> None:
    # GIVEN 99 units of weight at 0.5 s and 1 unit at 30 s
    histogram = LagHistogram()
    histogram.add(0.5, 99.0)
    histogram.add(30.0, 1.0)
    # WHEN the percentiles are read
    p50, p99, p100 = histogram.percentiles((50, 99, 100))
    # THEN p99 stays with the bulk and only p100 reaches the tail
    assert p50 == pytest.approx(0.5, abs=0.001)
    assert p99 == pytest.approx(0.5, abs=0.001)
    assert p100 == 30.0


def test_piece_commits_once_per_transaction() -> None:
    # GIVEN 98 steps in transactions of 49, 2 s each, starting at t = 10
    piece = Piece(
        shard=0, bucket=0, first=0, count=98, start=10, step_seconds=2, per_transaction=49
    )
    # WHEN sampled
    samples = list(piece.samples(0, 98))
    # THEN each sample commits with its transaction, and the weights add up to the steps
    assert {commit for commit, _, _ in samples} == {12.0, 14.0}
    assert sum(weight for _, _, weight in samples) == pytest.approx(98)
    assert piece.end == 14.0


def test_simulation_walks_the_shards_of_a_group_in_turn() -> None:
    # GIVEN one group of 2 shards, each with 98 strict steps (2 transactions of 0.5 s)
    scenario = Scenario(
        workload=strict_only(196),
        design=Design(shards=2, group_size=2, lookahead=120),
        platform=platform(lambda_timeout=INF),
        single_tick_at=-100,
    )
    # WHEN one tick runs
    pieces = sorted(Simulation(scenario).run(), key=lambda p: p.shard)
    # THEN the second shard starts only after the first one's transactions
    assert [p.shard for p in pieces] == [0, 1]
    assert pieces[1].start >= pieces[0].end


def test_groups_run_in_parallel_up_to_the_map_concurrency() -> None:
    # GIVEN 4 groups of one shard and a Map that runs 2 at once
    scenario = Scenario(
        workload=strict_only(4 * 98),
        design=Design(shards=4, group_size=1, lookahead=120, map_concurrency=2),
        platform=platform(),
    )
    # WHEN the ticks run
    pieces = sorted(Simulation(scenario).run(), key=lambda p: p.start)
    # THEN two shards start together and the other two wait for a free slot
    starts = [p.start for p in pieces]
    assert starts[0] == pytest.approx(starts[1])
    assert starts[2] >= pieces[0].end


def test_out_of_time_stops_a_bucket_midway_releases_and_the_next_tick_goes_on() -> None:
    # GIVEN one shard whose :00 bucket takes 100 s, and a 55 s Lambda that stops with 10 s left
    scenario = Scenario(
        workload=strict_only(49 * 200),
        design=Design(shards=1, group_size=1, lookahead=300),
        platform=platform(),
    )
    sim = Simulation(scenario)
    # WHEN the ticks run
    pieces = [p for p in sim.run() if p.bucket == 0]
    # THEN the first invocation stops between transactions before its timeout (none is
    # killed), releases the lease (the next tick's claim is not refused), and the next tick
    # finishes the bucket from where it stopped
    p = scenario.platform
    assert sim.timeouts == 0
    assert sim.leases_waited == 0
    first, second = pieces[0], pieces[1]
    assert first.count < 49 * 200
    assert first.end <= first.start + p.lambda_timeout - p.out_of_time + sim.step
    assert sum(piece.count for piece in pieces) == pytest.approx(49 * 200)
    assert second.start >= first.end


def test_a_failed_group_is_caught_up_by_a_later_tick() -> None:
    # GIVEN 2 groups, group 0 failing (with its retries) at the first tick reaching :00
    workload = strict_only(2 * 49 * 10)
    design = Design(shards=2, group_size=1, lookahead=240)
    healthy = Scenario(workload=workload, design=design, platform=platform())
    failed = replace(healthy, failed_group=0)
    # WHEN both run
    done = [
        {s: max(p.end for p in pieces if p.shard == s and p.bucket == 0) for s in (0, 1)}
        for pieces in (Simulation(healthy).run(), Simulation(failed).run())
    ]
    # THEN the healthy group is unaffected, the failed one finishes its bucket at a later
    # tick (its retries, seconds after the kill, meet the killed holder's live lease), and
    # every strict occurrence is still materialized in time
    assert done[1][1] == pytest.approx(done[0][1])
    assert done[1][0] > done[0][0] + 30
    result = simulate(failed)
    assert result.strict_committed == pytest.approx(1.0)
    assert result.strict[2] < 1.0


def test_relay_queue_serves_in_order_at_its_capacity() -> None:
    # GIVEN 1,000 strict occurrences relayed after materializing, at 100 records/s
    scenario = Scenario(
        workload=strict_only(1000),
        design=Design(shards=1, group_size=1, lookahead=600),
        platform=platform(lambda_timeout=INF),
        relay_capacity=100,
        relay_after_materialize=True,
        single_tick_at=-500,
    )
    # WHEN simulated
    result = simulate(scenario)
    # THEN the relay takes about 10 s after the last invocation, all before the instant
    assert result.relay_end - result.invocations_end == pytest.approx(10, abs=0.2)
    assert result.strict[2] < 1.0


def test_write_path_table_totals_the_measured_write_units() -> None:
    # GIVEN the operations table of the scheduler path before the narrow projections
    before = scheduler_ops()
    # WHEN the projections cut, then every cut made since, is applied
    projections = without(before, *CUT_PROJECTIONS)
    after = without(before, *CUT_ALL)
    # THEN the totals are the bench's measured 10.05, 8.05 and 6.05 write units an occurrence
    assert sum(op.units for op in before) == pytest.approx(10.05, abs=0.01)
    assert sum(op.units for op in projections) == pytest.approx(8.05, abs=0.01)
    assert sum(op.units for op in after) == pytest.approx(6.05, abs=0.01)
    # ... of which 6 are the three per-occurrence writes and the rest the shard's fence and
    # lease bookkeeping, shared by 49 schedules a transaction
    assert sorted(op.units for op in after if op.per_occurrence == 1) == [2, 2, 2]


def test_reserved_capacity_is_the_published_one_year_discount_and_the_rival_pays_its_send() -> None:
    prices = Prices()
    # 1-year reserved capacity is 54% off the provisioned rates once its upfront fee is spread
    # over the year's 8,760 hours ($150 + $0.0128/h per 100 WCU; $30 + $0.0025/h per 100 RCU)
    assert prices.reserved_wcu_hour == pytest.approx((150 / 8760 + 0.0128) / 100)
    assert prices.reserved_wcu_hour / prices.wcu_hour == pytest.approx(0.46, abs=0.005)
    assert prices.reserved_rcu_hour / prices.rcu_hour == pytest.approx(0.456, abs=0.005)
    # EventBridge Scheduler's deliverable: its invocation plus the SendMessage it makes
    assert prices.eventbridge_delivery * 1e6 == pytest.approx(1.40)


def test_the_bill_prices_only_dynamodb_capacity_by_how_it_is_bought() -> None:
    # GIVEN the scheduler path after every cut, on the seed's workload
    after = without(scheduler_ops(), *CUT_ALL)
    inputs = CostInputs(Workload(), Design(), platform(), shard_rate=450, peak_rate=7000)
    prices = inputs.prices
    # WHEN billed on demand, provisioned and reserved
    on_demand, provisioned, reserved = (bill(inputs, after, way) for way in billings(prices))
    # THEN on demand is the request-priced bill, line by line
    assert on_demand == write_lines(after, prices) + other_lines(inputs)
    # AND provisioned capacity kept 70% busy costs its unit-hour over 0.7 x 3,600 units, for
    # each write and read unit an occurrence uses (the reconciler's reads included)
    units = sum(op.units for op in after)
    for way, lines in (("wcu_hour", provisioned), ("reserved_wcu_hour", reserved)):
        writes = sum(d for group, _, d in lines if group == "DynamoDB writes")
        assert writes == pytest.approx(units * getattr(prices, way) / 2520 * 1e6)
    for (group, item, asked), bought in zip(on_demand, reserved, strict=True):
        assert (group, item) == bought[:2]
        if group == "DynamoDB reads" or item.startswith("DynamoDB reads"):
            ratio = prices.reserved_rcu_hour / 2520 / prices.read_request
            assert bought[2] == pytest.approx(asked * ratio)
        elif group != "DynamoDB writes":
            assert bought[2] == asked  # Lambda, SQS, logs, storage: bought one way
    # AND reserved < provisioned < on demand
    totals = [sum(d for _, _, d in lines) for lines in (reserved, provisioned, on_demand)]
    assert totals == sorted(totals)
    assert len(set(totals)) == 3


def test_cutting_an_unknown_operation_is_refused() -> None:
    with pytest.raises(ValueError, match="no such operation"):
        without(scheduler_ops(), "a write nobody makes")


def test_by_tenant_on_every_step_caps_the_shard_rate_when_many_groups_run() -> None:
    # GIVEN 40 groups at once and a tenant with 10% of the peak
    design = Design(shards=320)
    workload = Workload()
    # WHEN the hot keys' caps are computed before and after the narrow projections
    before = partition_caps(workload, design, scheduler_ops(), Limits())
    after = partition_caps(workload, design, without(scheduler_ops(), *CUT_PROJECTIONS), Limits())
    # THEN the tenant's by_tenant key (1,000 WCU/s over 40 shards x 10%) binds before only
    assert min(before.values()) == pytest.approx(250)
    assert min(after.values()) == pytest.approx(1000)


def test_defaults_miss_the_target_at_the_peak_and_more_shards_meet_it() -> None:
    # GIVEN the deployed defaults (N 64, L 180 s) and the modeled AWS service times
    workload = Workload()
    ops = without(scheduler_ops(), *CUT_ALL)
    small = Design(shards=64, lookahead=180)
    large = Design(shards=320, lookahead=180)
    # WHEN the top of the hour is simulated with one group failed
    missed = simulate(
        aws_scenario(workload, small, aws_platform(small, MEASURED), ops, failed=True)
    )
    met = simulate(aws_scenario(workload, large, aws_platform(large, MEASURED), ops, failed=True))
    # THEN 8 materializers at once cannot finish 500k in time, 40 can
    assert missed.strict[2] > 60
    assert met.strict[2] <= 1.0


def test_check_tolerances_relative_and_absolute() -> None:
    assert Check("seconds", 110, 100, 0.2).ok
    assert not Check("seconds", 130, 100, 0.2).ok
    assert Check("lag", 0.52, 0.50, 0.05, absolute=True).ok
    assert not Check("lag", 0.60, 0.50, 0.05, absolute=True).ok


def test_cross_check_reproduces_the_local_bench_and_catches_a_wrong_one() -> None:
    # GIVEN the measured local bench, and the same with a materialize time twice as long
    checks, _ = cross_check(MEASURED)
    wrong, _ = cross_check(replace(MEASURED, materialize_seconds=2 * MEASURED.materialize_seconds))
    # THEN the model matches the measurement within tolerance, and the altered one fails
    assert all(check.ok for check in checks), [c for c in checks if not c.ok]
    assert not next(c for c in wrong if c.what.startswith("materialize")).ok
    assert math.isfinite(checks[0].predicted)


def test_the_relays_batching_window_cuts_its_invocations_and_logs_and_pays_for_prompt_sends():
    # GIVEN the seed's workload billed as deployed (a 2 s window, the API's prompt sends)
    # and as it was (no window, nothing sent by the API)
    inputs = CostInputs(Workload(), Design(), platform(), shard_rate=450, peak_rate=7000)
    assert inputs.relay_window == 2
    was = {
        (g, i.split(" (")[0]): d
        for g, i, d in other_lines(replace(inputs, relay_window=0.0, prompt_share=0.0))
    }
    now = {(g, i.split(" (")[0]): d for g, i, d in other_lines(inputs)}
    # THEN the relay's requests, its GB-s and its log lines fall with the fuller batches ...
    for line in (("Lambda", "relay requests"), ("Lambda", "relay GB-s")):
        assert now[line] < was[line] / 3
    logs = ("CloudWatch", "Logs ingestion")
    assert now[logs] < was[logs] / 3
    # ... and each prompt send is one more SendMessage, for the share the API sends
    prompt = ("SQS", "the API's prompt sends")
    assert was[prompt] == 0
    assert now[prompt] == pytest.approx(0.01 * inputs.prices.sqs_request * 1e6)
    # AND nothing on the path reads an occurrence before sending it (the relay reads nothing)
    assert [i for g, i in now if g == "DynamoDB reads"] == ["due index Query"]


# --- payloads and the due index (scripts/capacity/payloads.py) -------------------------------


def test_item_bytes_follows_dynamodbs_item_size_rules():
    # a string: name + UTF-8 bytes; a number: name + 1 byte per 2 significant digits + 1
    assert item_bytes({"a": {"S": "xyz"}}) == 1 + 3
    assert item_bytes({"n": {"N": "12345"}}) == 1 + 3 + 1
    # a map or list: 3 bytes, 1 per element, the elements (a map's names included)
    assert item_bytes({"m": {"M": {"k": {"S": "v"}}}}) == 1 + 3 + (1 + 1 + 1)
    assert item_bytes({"l": {"L": [{"N": "1"}, {"BOOL": True}]}}) == 1 + 3 + (1 + 2) + (1 + 1)


def test_the_due_entry_no_longer_grows_with_the_payload_and_the_version_read_does():
    rows = payload_rows()
    assert [r.payload for r in rows] == list(SIZES)
    # GIVEN payloads from none to the largest
    smallest, largest = rows[0], rows[-1]
    # THEN before, the due entry (and by_shard's) carried the payload: 33 write units a move
    assert largest.current_before > largest.payload > smallest.current_before
    assert largest.index_units(largest.current_before) == 33
    assert largest.shard_before > largest.payload
    # AND now every entry is under a write unit, whatever the payload
    assert {r.index_units(r.current_after) for r in rows} == {1}
    assert max(r.shard_after for r in rows) < 1024
    assert max(r.current_after for r in rows) - min(r.current_after for r in rows) < 32
    # AND a step with a payload reads its version item, eventually consistent, once
    assert smallest.payload_read_units == 0
    assert largest.payload_read_units == math.ceil(largest.version / 4096) / 2 == 4.5
    assert rows[1].payload_read_units == 0.5


def test_ledger_costs_a_page_per_tenant_and_shard_an_hour_within_the_budget() -> None:
    # A page of a few occurrences is one unit; one listing them all grows with them.
    assert page_units(5, 0.0) == 1
    assert page_units(65, 1.0) > page_units(65, 0.1) >= 1
    found = costs(Workload(), Design(shards=128))
    assert [round(c.per_occurrence, 4) for c in found][:1] == [
        round((1000 * 128 + 128) / (200e6 / 24), 4)
    ]
    assert all(c.per_occurrence <= BUDGET for c in found)
    # (more tenants than the budget allows with fires on every shard: over it)
    crowded = costs(Workload(tenants=40_000), Design(shards=128))
    assert crowded[0].per_occurrence > BUDGET

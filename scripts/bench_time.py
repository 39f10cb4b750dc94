"""Planning throughput: fires of 500,000 cron schedules over one hour.

The schedules draw from 1,000 distinct (expression, zone) pairs, as real fleets
do. Punctual's planner is measured cold (caches cleared) over every schedule;
the naive baseline (one croniter iterator per schedule) over a sample, since it
would take minutes over all of them. Both figures are per second, so they
compare directly. Run: ``make bench-time`` (options: ``--help``).
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime

from croniter import croniter

from punctual.timing import CronRule, get_zone, parse_cron
from punctual.timing.rules import clear_plan_caches, parse_cron_cached
from punctual.timing.zones import zone_names

TEMPLATES = [
    "{m} {h} * * *",
    "{m} {h} * * 1-5",
    "*/5 * * * *",
    "*/15 * * * *",
    "{m} * * * *",
    "{m} */2 * * *",
    "0 {h} * * mon",
    "{m} {h} 1 * *",
    "0,30 {h}-{h2} * * *",
    "{m} {h} * * sat,sun",
]


def make_pairs(count: int, rng: random.Random) -> list[tuple[str, str]]:
    zones = sorted(zone_names())
    pairs: set[tuple[str, str]] = set()
    while len(pairs) < count:
        h = rng.randrange(0, 22)
        expr = rng.choice(TEMPLATES).format(m=rng.randrange(60), h=h, h2=h + rng.randrange(1, 3))
        pairs.add((expr, rng.choice(zones)))
    return sorted(pairs)


def punctual_plan(schedules: list[tuple[str, str]], after: int, until: int) -> int:
    total = 0
    for expression, zone in schedules:
        total += len(CronRule(parse_cron_cached(expression), get_zone(zone)).fires(after, until))
    return total


def croniter_plan(schedules: list[tuple[str, str]], after: int, until: int) -> int:
    total = 0
    for expression, zone in schedules:
        it = croniter(expression, datetime.fromtimestamp(after, get_zone(zone)))
        while it.get_next(float) <= until:
            total += 1
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=500_000)
    parser.add_argument("--pairs", type=int, default=1_000)
    parser.add_argument("--baseline-sample", type=int, default=20_000)
    parser.add_argument("--window-start", default="2026-03-29T00:30:00+00:00")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    pairs = make_pairs(args.pairs, rng)
    schedules = [rng.choice(pairs) for _ in range(args.schedules)]
    after = int(datetime.fromisoformat(args.window_start).timestamp())
    until = after + 3600
    for expression, _ in pairs:
        parse_cron(expression)  # every pair is valid before timing starts

    clear_plan_caches()
    started = time.perf_counter()
    fires = punctual_plan(schedules, after, until)
    ours = time.perf_counter() - started

    sample = schedules[: args.baseline_sample]
    started = time.perf_counter()
    base_fires = croniter_plan(sample, after, until)
    base = time.perf_counter() - started
    our_sample_fires = punctual_plan(sample, after, until)

    ours_rate = fires / ours
    base_rate = base_fires / base
    window = datetime.fromtimestamp(after, UTC).isoformat()
    print(f"window: one hour from {window}; {len(pairs)} (expression, zone) pairs")
    print(
        f"punctual (cached planner): {args.schedules:>9,} schedules, {fires:>10,} fires, "
        f"{ours:7.2f} s, {ours_rate:>12,.0f} fires/s, {args.schedules / ours:>12,.0f} sched/s"
    )
    print(
        f"croniter per schedule:     {len(sample):>9,} schedules, {base_fires:>10,} fires, "
        f"{base:7.2f} s, {base_rate:>12,.0f} fires/s, {len(sample) / base:>12,.0f} sched/s"
    )
    print(f"ratio (punctual / croniter, fires per second): {ours_rate / base_rate:,.1f}x")
    if our_sample_fires != base_fires:
        print(
            f"note: on the sample croniter planned {base_fires:,} fires and punctual "
            f"{our_sample_fires:,}; the window crosses the EU spring-forward, where the "
            "two apply different DST rules"
        )


if __name__ == "__main__":
    main()

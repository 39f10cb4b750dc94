"""`make simulate`: seeded, fault-injecting simulations of Punctual; prints what was run,
the faults injected by kind, the repairs, and every violation of the contract.

    python -m scripts.simulate [--seed N] [--trials K] [--days D] [--schedules S]

A seed replays its world (schedules, requests, faults, outages, in the same order): run a
failing one again with --seed N --trials 1. DynamoDB Local decides on its own clock when a
stream record can be read, which may batch the relay's records differently from one run to
the next: a replay may differ in such details (and in the fault draws that follow them).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from punctual.observability import logger
from punctual_local.dynamodb import start as start_dynamodb_local
from tests.sim.explain import explain, schedule_of
from tests.sim.oracle import Verdict, check
from tests.sim.world import SimConfig, Simulation


def trial(
    config: SimConfig, dynamodb: object
) -> tuple[Verdict, Counter[str], Counter[str], list[str]]:
    """One run: its verdict, the faults injected, what was done, and the story of the first
    schedule of each kind of violation (tests/sim/explain.py)."""
    run = Simulation(config, dynamodb).run()
    counts = run.counts + Counter(
        {
            "bad items skipped": run.bad_items.count,
            "zone rules changed": run.rules_changed_at is not None,
            "failed over": run.failed_over_at is not None,
            "relay mappings made anew": run.remapped_at is not None,
        }
    )
    verdict = check(run)
    stories = []
    for kind, examples in verdict.examples.items():
        schedule_id = schedule_of(examples[0])
        if schedule_id is not None:
            stories += [f"{kind}: {examples[0]}", *explain(run, schedule_id)]
    return verdict, run.injected, counts, stories


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--schedules", type=int, default=200)
    args = parser.parse_args(argv)
    logger.setLevel("CRITICAL")  # the faults make the code log what it survives, by design
    engine = start_dynamodb_local()
    try:
        dynamodb = engine.client()
        totals: Counter[str] = Counter()
        injected: Counter[str] = Counter()
        activity: Counter[str] = Counter()
        violations: Counter[str] = Counter()
        failing = []
        schedule_days = 0.0
        began = time.monotonic()
        for seed in range(args.seed, args.seed + args.trials):
            config = SimConfig(seed=seed, days=args.days, schedules=args.schedules)
            started = time.monotonic()
            verdict, faults, counts, stories = trial(config, dynamodb)
            schedule_days += verdict.schedule_days
            injected.update(faults)
            activity.update(counts)
            violations.update(verdict.violations)
            totals.update(
                {
                    "schedules": verdict.schedules,
                    "occurrences": verdict.occurrences,
                    "handler runs": verdict.runs,
                    "fires checked": verdict.fires_checked,
                    "missed by policy": verdict.missed_by_policy,
                    "fired late by policy": verdict.fired_late,
                    "runs now and backfilled checked": verdict.manual,
                    "payloads checked (messages and occurrences)": verdict.payloads,
                    "hostile items unreadable": verdict.hostile_items,
                    "lost before a take-over (known limit)": verdict.left_by_failover,
                }
            )
            status = (
                "ok" if not verdict.violations else f"{sum(verdict.violations.values())} violations"
            )
            print(
                f"seed {seed}: {verdict.schedules} schedules, {verdict.schedule_days:.0f} "
                f"schedule-days, {verdict.occurrences} occurrences, "
                f"{sum(faults.values())} faults, {time.monotonic() - started:.0f} s: {status}"
            )
            for kind, examples in verdict.examples.items():
                print(f"  {kind}: {verdict.violations[kind]}, e.g. {'; '.join(examples)}")
            if verdict.violations:
                failing.append(seed)
                print("\n".join(f"    {line}" for line in stories))
        print(
            f"\n{args.trials} trials, {args.trials * args.days:g} simulated days, "
            f"{schedule_days:.0f} schedule-days in {time.monotonic() - began:.0f} s"
        )
        print("totals:", ", ".join(f"{k} {v}" for k, v in totals.items()))
        print("faults injected:", ", ".join(f"{k} {v}" for k, v in sorted(injected.items())))
        print("activity:", ", ".join(f"{k} {v}" for k, v in sorted(activity.items())))
        print(
            "violations:",
            ", ".join(f"{k} {v}" for k, v in sorted(violations.items())) or "0",
        )
        if failing:
            print(f"failing seeds: {failing} (replay: --seed N --trials 1)")
            return 1
        return 0
    finally:
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())

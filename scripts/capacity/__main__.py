"""`make capacity`: python -m scripts.capacity [--help]."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import scripts.capacity as capacity
from scripts.capacity.calibration import calibrate
from scripts.capacity.model import Design, Workload
from scripts.capacity.report import report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.capacity", description=capacity.__doc__
    )
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

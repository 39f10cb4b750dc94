"""Fail-over (docs/multi-region.md): this region takes over the schedules homed in another.

Each schedule of a shard homed in the failed region (or homed nowhere: written before homes
were recorded) gets this region as its home and the next generation, in one conditional
update; from then on the failed region's materializer is fenced off (its step's condition
names the generation it read) and this region's plans the schedule. The cursor is rewound
by ``rewind`` seconds: what the failed region planned in its last minutes may never have
reached a queue (its relay, its queues, its table's copy of those occurrences are out of
reach), so those fires are planned again here, under the schedule's misfire policy. A fire
the failed region did deliver can then be delivered twice, with the same occurrence id
(at least once: the consumer's dedupe on the id is the last line).

    python -m punctual.pipeline.failover --from us-east-1 [--shards 0-7] [--rewind 900]

runs with this region's settings (PUNCTUAL_REGION or AWS_REGION, the tables' names).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from punctual.dal.common import ConditionFailed, Label
from punctual.dal.schedules import StoredSchedule
from punctual.domain.errors import Retryable
from punctual.domain.ids import minute_of
from punctual.domain.planning import Cursor, cursor_after
from punctual.domain.schedule import ScheduleState
from punctual.services import Services

REWIND_SECONDS = 900  # the relay sends a due occurrence within seconds; 15 minutes to spare
TAKE_OVER_ATTEMPTS = 3  # a schedule changed under the take-over is read again this many times


@dataclass
class TakeOver:
    """What a take-over of one shard did: the schedules it moved here, and those that kept
    changing under it (an API change, the old region's materializer): run it again."""

    shard: int
    taken: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def take_over(
    services: Services, shard: int, failed_region: str | None, *, rewind: int = REWIND_SECONDS
) -> TakeOver:
    """Home here the shard's schedules homed in ``failed_region``, or, with None, those
    homed nowhere (written before homes were recorded: every region plans those, so they
    must be homed before the table is replicated; nothing is rewound, all their history
    is here)."""
    region = services.settings.region
    if failed_region == region:
        raise ValueError(f"{region} cannot take over from itself")
    report = TakeOver(shard)
    # The shard index is eventually consistent: a schedule made in the last moments before
    # the failure may be missing here; a second run (docs/multi-region.md) takes it.
    for page in services.schedules.list_for_shard(shard, created_before="\uffff"):
        for listed in page:
            schedule_id = listed.schedule.schedule_id
            for _ in range(TAKE_OVER_ATTEMPTS):
                # Consistent: the generation read is the one the condition names.
                stored = services.schedules.current(schedule_id)
                home = stored.schedule.home_region if stored else region
                if home is not None and home != failed_region:
                    break  # gone, or not the failed region's (already taken, or another's)
                assert stored is not None
                walked = services.leases.watermark(shard)
                if walked is None:
                    # This region never walked the shard: give it a watermark to walk from.
                    services.leases.open(shard, now=int(services.now()))
                    continue
                actions = (
                    [
                        (
                            Label.SCHEDULE,
                            services.schedules.take_over_action(stored, region, since=None),
                        )
                    ]
                    if failed_region is None
                    else _moved(services, stored, walked, rewind)
                )
                try:
                    services.transactions.commit(actions)
                except (ConditionFailed, Retryable):
                    continue
                report.taken.append(schedule_id)
                break
            else:
                report.conflicts.append(schedule_id)
    return report


def _moved(
    services: Services, stored: StoredSchedule, walked: int, rewind: int
) -> list[tuple[Label, dict[str, Any]]]:
    """The actions homing ``stored`` here at the next generation, its cursor rewound and
    placed in a due bucket ahead of this region's walk of the shard (``walked``)."""
    schedule = stored.schedule
    region = services.settings.region
    # Fires due by then are the failed region's: their records are in its table.
    back = int(services.now()) - rewind
    if schedule.state is not ScheduleState.ACTIVE or schedule.next_available_at is None:
        return [(Label.SCHEDULE, services.schedules.take_over_action(stored, region, since=back))]
    cursor = Cursor(schedule.planned_until or 0, schedule.next_run_at, schedule.next_available_at)
    if schedule.planned_until is not None and schedule.planned_until > back:
        rewound = cursor_after(schedule, back)
        cursor = rewound if rewound.next_available_at is not None else cursor
    assert cursor.next_available_at is not None
    # This region's walk of the shard may be past the bucket the failed region left it in
    # (it walked by, skipping another region's schedule): place it ahead of the walk.
    placed = max(cursor.next_available_at, walked + 2 * 60)
    return [
        (
            Label.SCHEDULE,
            services.schedules.take_over_action(
                stored, region, since=back, cursor=cursor, placed=placed
            ),
        ),
        (Label.SHARD, services.leases.not_walked_action(stored.shard, minute_of(placed))),
    ]


def _shards(text: str, count: int) -> list[int]:
    first, _, last = text.partition("-")
    low, high = int(first), int(last or first)
    if not 0 <= low <= high < count:
        raise ValueError(f"shards are 0..{count - 1}")
    return list(range(low, high + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m punctual.pipeline.failover", description=__doc__
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="failed", metavar="REGION", help="the failed region")
    source.add_argument(
        "--unhomed",
        action="store_true",
        help="home here the schedules written before homes were recorded (before replicating)",
    )
    parser.add_argument("--shards", metavar="A-B", help="default: every shard")
    parser.add_argument("--rewind", type=int, default=REWIND_SECONDS, metavar="SECONDS")
    args = parser.parse_args(argv)
    services = Services.from_environment()
    count = services.settings.shard_count
    try:
        shards = _shards(args.shards, count) if args.shards else list(range(count))
        if args.rewind < 0:
            raise ValueError("--rewind is seconds, 0 or more")
        reports = [take_over(services, s, args.failed, rewind=args.rewind) for s in shards]
    except ValueError as error:
        print(f"punctual.pipeline.failover: {error}", file=sys.stderr)
        return 2
    taken = sum(len(r.taken) for r in reports)
    left = [sid for r in reports for sid in r.conflicts]
    what = f"from {args.failed}" if args.failed else "homed nowhere"
    print(f"took over {taken} schedules {what}; {len(left)} kept changing")
    for schedule_id in left:
        print(f"  again: {schedule_id}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared steps of the materializer's integration tests. They give a crash point (a process
killed there), read a schedule's current item and its occurrences, find a schedule's shard
and run one tick of the materializer on it, and crowd one bucket with schedules due in the
same minute of one shard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from punctual.domain.ids import shard_of
from punctual.pipeline.materializer import Materializer
from punctual.services import Services
from tests.integration.conftest import Clock
from tests.integration.helpers import current_item, make


class Crash(BaseException):
    """A crash point: the process dies there. Not an Exception, as a kill is not one: the
    materializer's error path (which releases its lease) must not run."""


def current(aws: Services, schedule_id: str) -> dict[str, Any]:
    return current_item(aws, schedule_id)


def occurrences(aws: Services, schedule_id: str) -> list[dict[str, Any]]:
    found, _ = aws.occurrences.list_for_schedule(
        schedule_id, since=0, until=2**40, limit=1000, token=None
    )
    return [o.model_dump() for o in found]


def instants(aws: Services, schedule_id: str) -> list[int]:
    return sorted(o["scheduled_for"] for o in occurrences(aws, schedule_id))


def shard(aws: Services, schedule_id: str) -> int:
    return shard_of(schedule_id, aws.settings.shard_count)


def tick(aws: Services, clock: Clock, schedule_id: str, holder: str = "m1", **kw: Any) -> Any:
    return Materializer(aws, holder, **kw).run_shard(int(clock.now), shard(aws, schedule_id))


def crash_at(point: str, times: int = 1) -> Callable[[str], None]:
    left = [times]

    def hook(where: str) -> None:
        if where == point and left[0] > 0:
            left[0] -= 1
            raise Crash(point)

    return hook


def crowded_bucket(
    aws: Services, spec: dict[str, Any] | Callable[[int], dict[str, Any]], count: int
) -> tuple[int, list[str]]:
    """``count`` schedules due in one bucket of one shard (made until one shard has that
    many; ``spec`` may be given the number made before, to spread them within the minute):
    the bucket's minute, and its schedules in the order the walk reads them."""
    by_shard: dict[int, list[str]] = {}
    while max((len(v) for v in by_shard.values()), default=0) < count:
        made = sum(map(len, by_shard.values()))
        sid = make(aws, spec=spec(made) if callable(spec) else spec)
        by_shard.setdefault(shard(aws, sid), []).append(sid)
    crowded = next(v for v in by_shard.values() if len(v) >= count)
    minute = current(aws, crowded[0])["next_available_at"] // 60 * 60
    return minute, [
        s.schedule.schedule_id for s in aws.schedules.due_in(minute, shard(aws, crowded[0]))
    ]

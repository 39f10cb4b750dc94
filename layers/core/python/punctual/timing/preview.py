"""Preview: the next N fires of a rule in UTC and local time, with DST notes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from itertools import pairwise
from zoneinfo import ZoneInfo

from punctual.timing.rules import CronRule, Rule, cron_steps
from punctual.timing.zones import Gap, Repeat, Resolution, local_text, utc_text

MAX_PREVIEW = 1000


@dataclass(frozen=True, slots=True)
class Fire:
    instant: int
    utc: str
    local: str


@dataclass(slots=True)
class Preview:
    fires: list[Fire] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "fires": [{"utc": f.utc, "local": f.local} for f in self.fires],
            "notes": list(self.notes),
        }


def preview(rule: Rule, after: int, count: int, zone: ZoneInfo) -> Preview:
    """The first ``count`` fires strictly after ``after``; ``zone`` is for local display."""
    if not 1 <= count <= MAX_PREVIEW:
        raise ValueError(f"count must be between 1 and {MAX_PREVIEW}")
    if isinstance(rule, CronRule):
        return _preview_cron(rule, after, count)
    result = Preview()
    cursor = after
    while len(result.fires) < count:
        instant = rule.next_after(cursor)
        if instant is None:
            break
        result.fires.append(Fire(instant, utc_text(instant), local_text(instant, zone)))
        cursor = instant
    result.notes.extend(_offset_change_notes(result.fires, zone))
    return result


def _preview_cron(rule: CronRule, after: int, count: int) -> Preview:
    result = Preview()
    fire = rule.next_after(after)
    while fire is not None and len(result.fires) < count:
        result.fires.append(Fire(fire, utc_text(fire), local_text(fire, rule.zone)))
        fire = rule.next_after(fire)
    if result.fires:
        result.notes.extend(_dst_notes(rule, after, result.fires[-1].instant))
    return result


_GAP_DONE = {Gap.SKIP: "skipped", Gap.SHIFT: "fired at the first instant after the gap"}
_REPEAT_DONE = {
    Repeat.FIRST: "fired once, at the earlier instant",
    Repeat.LAST: "fired once, at the later instant",
    Repeat.BOTH: "fired at both instants",
}


def _dst_notes(rule: CronRule, after: int, last: int) -> list[str]:
    """What the zone's transitions did to the wall times matched up to the last fire shown,
    a note per date, as the rule's DST policy says."""
    skipped: dict[date, list[datetime]] = defaultdict(list)
    repeated: dict[date, list[datetime]] = defaultdict(list)
    # Skipped wall times are noted only once a later fire is shown: none past the last one.
    pending: list[datetime] = []
    lo, _ = rule.bounds.clip(after, None)
    for step in cron_steps(rule.expr, rule.zone, lo, rule.dst):
        if not step.instants:
            pending.append(step.wall)
            continue
        if step.instants[0] > last:
            break
        for wall in pending:
            skipped[wall.date()].append(wall)
        pending.clear()
        if step.resolution is Resolution.SKIPPED:
            skipped[step.wall.date()].append(step.wall)
        elif step.resolution is Resolution.REPEATED:
            repeated[step.wall.date()].append(step.wall)
    zone_name = rule.zone_name
    notes = [
        (
            day,
            f"{day}: {_times(walls)} {_do(walls)} not exist in {zone_name} "
            f"(the clocks skip ahead); {_GAP_DONE[rule.dst.gap]}",
        )
        for day, walls in skipped.items()
    ] + [
        (
            day,
            f"{day}: {_times(walls)} {_do(walls, 'occur', 'occurs')} twice in {zone_name} "
            f"(the clocks fall back); {_REPEAT_DONE[rule.dst.repeat]}",
        )
        for day, walls in repeated.items()
    ]
    return [text for _, text in sorted(notes)]


def _do(walls: list[datetime], plural: str = "do", singular: str = "does") -> str:
    return singular if len(walls) == 1 else plural


def _times(walls: list[datetime]) -> str:
    if len(walls) <= 4:
        return ", ".join(w.strftime("%H:%M") for w in walls)
    return f"{len(walls)} wall times from {walls[0]:%H:%M} to {walls[-1]:%H:%M}"


def _offset_change_notes(fires: list[Fire], zone: ZoneInfo) -> list[str]:
    notes = []
    for previous, current in pairwise(fires):
        before = datetime.fromtimestamp(previous.instant, zone).utcoffset()
        now = datetime.fromtimestamp(current.instant, zone).utcoffset()
        if before != now:
            day = datetime.fromtimestamp(current.instant, zone).date()
            notes.append(
                f"{day}: the UTC offset of {zone.key} changes before this fire; "
                "elapsed-time rules keep their interval, so the local time shifts"
            )
    return notes

"""Fire rules: which instants a cron, rate or one-shot schedule fires at.

All instants are whole epoch seconds. Windows are half-open ``(after, until]``:
a fire at exactly ``after`` has already happened; "the next fire after t" is
always strictly later than t.

Cron walks *local wall-clock* minutes in calendar order and maps each to the
earliest instant that shows it. That mapping is strictly increasing over the
wall times that exist, which is what makes the rules of the contract hold:
a nonexistent wall time is skipped, a repeated one fires once (at the earlier
instant), and walking from ``wall(after)`` never yields an instant <= after.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo

from punctual.timing.cron import CronExpr, days_in_month, parse_cron
from punctual.timing.zones import (
    _FORGET,
    DEFAULT_DST,
    MAX_INSTANT,
    DstPolicy,
    Gap,
    Repeat,
    Resolution,
    chosen_instants,
    get_zone,
    in_calendar,
    instants_of,
    local_wall,
    offset_changes,
    to_epoch,
    utc_text,
)

# A cron walk gives up after this many years without a fire (the parser already
# rejects expressions that can never fire; this only bounds pathological bounds).
_MAX_WALK_YEARS = 400
# A zone transition moves wall time by at most a day (Pacific/Apia, 2011).
_WALL_SLACK = timedelta(days=2)
_DAY = 86400


class Rule(Protocol):
    """What the planner needs from any schedule kind."""

    def fires(self, after: int, until: int) -> tuple[int, ...]:
        """Every fire in (after, until], in order."""
        ...

    def next_after(self, after: int) -> int | None:
        """The first fire strictly after ``after``, or None when there is none."""
        ...


@dataclass(frozen=True, slots=True)
class Bounds:
    """Optional start_at / end_at, both inclusive, as epoch seconds."""

    start: int | None = None
    end: int | None = None

    def clip(self, after: int, until: int | None) -> tuple[int, int]:
        """The window ``(after, until]`` within these bounds and the calendar: no rule fires
        past its end (MAX_INSTANT)."""
        if self.start is not None:
            after = max(after, self.start - 1)
        return after, min(
            MAX_INSTANT if until is None else until,
            MAX_INSTANT if self.end is None else self.end,
        )


@dataclass(frozen=True, slots=True)
class WallStep:
    """One matching wall minute of a cron walk and what became of it: the instants it fires
    at under the schedule's DST policy (none for a skipped wall time, two for a repeated
    one fired at both), in order."""

    wall: datetime
    instants: tuple[int, ...]
    resolution: Resolution


@lru_cache(maxsize=4096)
def _wall_times(expr: CronExpr) -> tuple[time, ...]:
    """The expression's times of day, in order (its hours and minutes are sorted)."""
    return tuple(time(h, m) for h in expr.hours for m in expr.minutes)


def _matching_walls(expr: CronExpr, start: datetime) -> Iterator[datetime]:
    """Matching naive wall minutes in calendar order, from ``start`` (a whole minute)."""
    year, month = start.year, start.month
    first_day = start.day
    times = _wall_times(expr)
    # The start's day from its minute on: not every minute of it since midnight (a plan of
    # "* * * * *" at 23:59 walked 1,439 walls to skip them).
    from_start, start_day = times[bisect_left(times, start.time()) :], start.date()
    for _ in range(_MAX_WALK_YEARS * 12):
        if month in expr.months:
            for day_number in range(first_day, days_in_month(year, month) + 1):
                day = date(year, month, day_number)
                if expr.matches_date(day):
                    for at in from_start if day == start_day else times:
                        yield datetime.combine(day, at)
        first_day = 1
        month += 1
        if month == 13:
            year, month = year + 1, 1
            if year > 9998:
                return


def cron_steps(
    expr: CronExpr, zone: ZoneInfo, after: int, dst: DstPolicy = DEFAULT_DST
) -> Iterator[WallStep]:
    """Matching wall minutes with an instant > after (or that do not exist), in order.

    The walk's instants rise with its wall times: each step's first instant is later than
    the one before (the earliest instant showing a wall time, the later one of a repeated
    wall time fired LAST and the end of a gap all rise with the wall time). A repeated wall
    time fired at BOTH instants has its later one after the first instants of the next
    steps: a consumer that wants instants in order sorts them.
    """
    start_wall = local_wall(after, zone).replace(second=0, microsecond=0)
    if dst.repeat is not Repeat.FIRST and offset_changes(zone.key, after, after + _DAY * 2):
        # A repeated wall time fired at its later instant may show a wall time earlier than
        # ``after``'s (after lies in the first pass of the repeated hour): walk from before.
        # (No zone's clocks skip ahead within two days before they fall back, 1850-2037, so
        # no skipped wall time lies in the extra walk.)
        start_wall -= _WALL_SLACK
    for wall in _matching_walls(expr, start_wall):
        instants, resolution = chosen_instants(wall, zone, dst)
        if instants and instants[-1] <= after:
            continue
        yield WallStep(wall, instants, resolution)


@lru_cache(maxsize=65536)
def _cron_window(
    source: str, zone_name: str, after: int, until: int, dst: DstPolicy = DEFAULT_DST
) -> tuple[int, ...]:
    """Fires of one (expression, zone, DST policy) in (after, until]; shared by every schedule
    using it."""
    zone = get_zone(zone_name)
    stop_wall = local_wall(until, zone) + _WALL_SLACK
    fires: set[int] = set()
    for step in cron_steps(parse_cron_cached(source), zone, after, dst):
        if step.wall > stop_wall:
            break
        if not step.instants:
            continue
        if step.instants[0] > until:
            break  # every later step's instants are later still
        fires.update(i for i in step.instants if after < i <= until)
    # (A set: several wall times of a gap shifted to its end fire once.)
    return tuple(sorted(fires))


@lru_cache(maxsize=16384)
def parse_cron_cached(source: str) -> CronExpr:
    return parse_cron(source)


def clear_plan_caches() -> None:
    """Forget cached parses and windows (benchmarks start cold; tests isolate)."""
    _cron_window.cache_clear()
    parse_cron_cached.cache_clear()
    _wall_times.cache_clear()


_FORGET.append(_cron_window.cache_clear)  # its windows follow the zone rules in use


def _clip_sorted(fires: tuple[int, ...], after: int, until: int) -> tuple[int, ...]:
    lo = bisect_right(fires, after)
    hi = bisect_right(fires, until)
    if lo == 0 and hi == len(fires):
        return fires
    return fires[lo:hi]


@dataclass(frozen=True, slots=True)
class CronRule:
    expr: CronExpr
    zone: ZoneInfo
    bounds: Bounds = Bounds()
    dst: DstPolicy = DEFAULT_DST

    @property
    def zone_name(self) -> str:
        return str(self.zone.key)

    def fires(self, after: int, until: int) -> tuple[int, ...]:
        lo, hi = self.bounds.clip(after, until)
        if lo >= hi:
            return ()
        # The unbounded window is what every schedule of this expression and zone shares.
        window = _cron_window(
            self.expr.source, self.zone_name, after, min(until, MAX_INSTANT), self.dst
        )
        return _clip_sorted(window, lo, hi)

    def next_after(self, after: int) -> int | None:
        lo, hi = self.bounds.clip(after, None)
        # The fires of the UTC day holding ``lo`` are a window every schedule of this
        # expression and zone shares (``_cron_window``): a step's few calls, and its
        # neighbours', read it instead of walking the calendar each. When the day has none
        # left after ``lo``, the calendar is walked, as before. (Past the calendar's end, a
        # fire the window holds is after ``hi``: none.)
        day = lo - lo % _DAY
        window = _cron_window(self.expr.source, self.zone_name, day, day + _DAY, self.dst)
        at = bisect_right(window, lo)
        if at < len(window):
            return window[at] if window[at] <= hi else None
        first: int | None = None
        for step in cron_steps(self.expr, self.zone, lo, self.dst):
            if not step.instants:
                continue
            if first is not None and step.instants[0] > first:
                break  # no later step fires sooner (a step's later instant may: BOTH)
            fire = min(i for i in step.instants if i > lo)
            first = fire if first is None else min(first, fire)
        return first if first is not None and first <= hi else None

    def matched_wall(self, instant: int) -> datetime:
        """The local wall time that a fire at ``instant`` is: the instant's own, or for a fire
        a gap's wall times were shifted to (gap SHIFT) the earliest of them, when the
        instant's own wall time is not one the expression matches."""
        wall = local_wall(instant, self.zone)
        expr = self.expr
        matches = wall.second == 0 and wall.minute in expr.minutes and wall.hour in expr.hours
        if self.dst.gap is Gap.SKIP or (matches and expr.matches_date(wall.date())):
            return wall
        for step in cron_steps(expr, self.zone, instant - 1, self.dst):
            if instant in step.instants:
                return step.wall
            if step.instants and step.instants[0] > instant:
                break
        return wall


_RATE = re.compile(r"^rate\(\s*([0-9]+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def parse_rate(expression: str) -> int:
    """'rate(15 minutes)' -> 900; ValueError with the reason otherwise."""
    match = _RATE.match(expression.strip().lower())
    if match is None:
        raise ValueError(
            f"{expression!r} is not a rate; write rate(N minutes|hours|days), e.g. rate(15 minutes)"
        )
    count = int(match.group(1))
    if count < 1:
        raise ValueError(f"{expression!r}: the interval must be at least 1")
    seconds = count * _UNIT_SECONDS[match.group(2).rstrip("s")]
    if seconds > 366 * 86400:
        raise ValueError(f"{expression!r}: the interval may be at most 366 days")
    return seconds


@dataclass(frozen=True, slots=True)
class RateRule:
    """Fires at anchor + k * interval (k >= 0): elapsed time, blind to DST."""

    interval: int
    anchor: int
    bounds: Bounds = Bounds()

    def _first_index_after(self, after: int) -> int:
        if after < self.anchor:
            return 0
        return (after - self.anchor) // self.interval + 1

    def fires(self, after: int, until: int) -> tuple[int, ...]:
        lo, hi = self.bounds.clip(after, until)
        k = self._first_index_after(lo)
        first = self.anchor + k * self.interval
        if first > hi:
            return ()
        return tuple(range(first, hi + 1, self.interval))

    def next_after(self, after: int) -> int | None:
        lo, hi = self.bounds.clip(after, None)
        instant = self.anchor + self._first_index_after(lo) * self.interval
        return instant if instant <= hi else None


@dataclass(frozen=True, slots=True)
class OneShotRule:
    """One instant; two when its local time occurs twice and the schedule fires at BOTH
    (``second``, the later one)."""

    instant: int
    bounds: Bounds = Bounds()
    second: int | None = None

    def _instants(self) -> tuple[int, ...]:
        return (self.instant,) if self.second is None else (self.instant, self.second)

    def fires(self, after: int, until: int) -> tuple[int, ...]:
        lo, hi = self.bounds.clip(after, until)
        return tuple(i for i in self._instants() if lo < i <= hi)

    def next_after(self, after: int) -> int | None:
        lo, hi = self.bounds.clip(after, None)
        return next((i for i in self._instants() if lo < i <= hi), None)


class NoSuchWallTime(ValueError):
    """A local date-time that its zone's clocks skip (and the gap policy is SKIP)."""


@dataclass(frozen=True, slots=True)
class ResolvedAt:
    instant: int
    note: str | None  # set when the local time was ambiguous or did not exist
    second: int | None = None  # the later instant of a repeated local time fired at BOTH


def resolve_at(text: str, zone_name: str | None, dst: DstPolicy = DEFAULT_DST) -> ResolvedAt:
    """An ISO-8601 instant with offset, or a local date-time read in ``zone_name``.

    A local time that does not exist is rejected with the reason (``dst.gap`` SKIP) or moved
    to the first instant after the gap (SHIFT); one that occurs twice resolves to the earlier
    instant (FIRST), the later one (LAST) or both (BOTH), and the note says so.
    """
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO-8601 date-time (e.g. 2026-03-08T09:00:00-05:00)"
        ) from None
    if moment.tzinfo is not None:
        if zone_name is not None:
            get_zone(zone_name)  # still reject a bad zone name
        return ResolvedAt(in_calendar(to_epoch(moment)), None)
    if zone_name is None:
        raise ValueError(f"{text!r} has no UTC offset; give one or a time zone")
    zone = get_zone(zone_name)
    wall = moment.replace(microsecond=0)
    instants, resolution = chosen_instants(wall, zone, dst)
    if not instants:
        raise NoSuchWallTime(
            f"{wall.isoformat()} does not exist in {zone_name} "
            "(the clocks skip it at a daylight-saving or zone change); pick another time"
        )
    for instant in instants:
        in_calendar(instant)
    note = None
    if resolution is Resolution.SKIPPED:
        note = (
            f"{wall.isoformat()} does not exist in {zone_name} (the clocks skip ahead); "
            f"shifted to the first instant after the gap, {utc_text(instants[0])}"
        )
    elif resolution is Resolution.REPEATED:
        first, later = instants_of(wall, zone)
        chosen = {
            Repeat.FIRST: f"using the earlier instant {utc_text(first)} "
            f"(the later one is {utc_text(later)})",
            Repeat.LAST: f"using the later instant {utc_text(later)} "
            f"(the earlier one is {utc_text(first)})",
            Repeat.BOTH: f"firing at both instants, {utc_text(first)} and {utc_text(later)}",
        }[dst.repeat]
        note = f"{wall.isoformat()} occurs twice in {zone_name}; {chosen}"
    return ResolvedAt(instants[0], note, instants[1] if len(instants) == 2 else None)

"""A schedule's rule in plain English, for the local console: a cron expression in the
dialect of docs/time.md (cronie's rule for the two day fields included), a rate, a
one-shot. What is too intricate to say well is said generically, never wrongly."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any

from punctual.timing import CronError, CronExpr, parse_cron, parse_rate

_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTH_NAMES = (
    *("January", "February", "March", "April", "May", "June", "July"),
    *("August", "September", "October", "November", "December"),
)
_WEEK = (1, 2, 3, 4, 5, 6, 0)  # Monday first, as a week is read (cron's 0 is Sunday)
_ALL_MINUTES = tuple(range(60))
_ALL_HOURS = tuple(range(24))
_ALL_DAYS = frozenset(range(1, 32))
_ALL_WEEKDAYS = frozenset(range(7))
_ALL_MONTHS = frozenset(range(1, 13))
_LISTED = 6  # at most this many times, days or runs are named one by one


def rule_in_words(spec: dict[str, Any]) -> str | None:
    """A schedule's rule in plain English (None: a rule this console cannot read)."""
    try:
        if spec["kind"] == "cron":
            return cron_in_words(spec["expression"])
        if spec["kind"] == "rate":
            return _every(parse_rate(spec["expression"]))
    except (CronError, ValueError):
        return None
    return "once" if spec["kind"] == "at" else None


def cron_in_words(expression: str) -> str:
    """A cron expression in plain English, in the dialect of docs/time.md (cronie's rule for
    the two day fields included). What is too intricate to say well is said generically
    ("48 times a day", "on 9 chosen days of the month"), never wrongly. CronError for an
    expression the API would refuse."""
    expr = parse_cron(expression)
    times = _times_of_day(expr.minutes, expr.hours)
    words = times or f"{len(expr.minutes) * len(expr.hours)} times a day"
    months = sorted(expr.months)
    if _only_days_of_month(expr) and len(expr.days) == 1 and len(months) == 1:
        return f"{words} on {_MONTH_NAMES[months[0] - 1]} {min(expr.days)}"
    days = _days(expr)
    if days:
        words += days
    elif words.startswith("at ") and expr.hours != _ALL_HOURS:  # (times of the day)
        words += " every day"
    if len(months) < 12:
        words += " in " + _and(_runs(months, lambda m: _MONTH_NAMES[m - 1]))
    return words


def _every(seconds: int) -> str:
    """rate(N unit) as said: the largest whole unit of its interval."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    return f"every {seconds} seconds"


def _and(items: Sequence[str], word: str = "and") -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def _step(values: Sequence[int]) -> int | None:
    """The common difference of sorted ``values`` (two or more), if they are evenly spaced."""
    if len(values) < 2:
        return None
    step = values[1] - values[0]
    evenly = all(b - a == step for a, b in pairwise(values))
    return step if evenly else None


def _even(values: Sequence[int], cycle: int) -> int | None:
    """The step of ``values`` if they keep it around the whole ``cycle`` too (``*/15``,
    ``5/15`` of an hour, not ``0-56``): then "every step" holds across its end."""
    step = _step(values)
    return step if step and len(values) * step == cycle else None


def _runs(values: Iterable[int], name: Callable[[int], str]) -> list[str]:
    """Sorted values as names, three or more in a row said as "A through B"."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    said = []
    for run in runs:
        if len(run) >= 3:
            said.append(f"{name(run[0])} through {name(run[-1])}")
        else:
            said.extend(name(v) for v in run)
    return said


def _hhmm(hour: int, minute: int) -> str:
    return f"{hour:02d}:{minute:02d}"


def _times_of_day(minutes: Sequence[int], hours: Sequence[int]) -> str | None:
    """When in a day it fires, or None where no short phrase says it exactly."""
    count = len(minutes) * len(hours)
    if minutes != _ALL_MINUTES and hours != _ALL_HOURS and count <= _LISTED:
        return "at " + _and([_hhmm(h, m) for h in hours for m in minutes])
    if hours == _ALL_HOURS:
        return _in_every_hour(minutes)
    start, end = hours[0], hours[-1]
    if len(hours) == end - start + 1:
        return _in_hours_from(start, end, minutes)  # one run of hours (or a single one)
    first = minutes[0]
    if (step := _step(hours)) and len(minutes) == 1:
        return f"every {step} hours from {_hhmm(start, first)} through {_hhmm(end, first)}"
    return None


def _in_every_hour(minutes: Sequence[int]) -> str | None:
    """The minutes of every hour it fires at, or None where no short phrase says them."""
    first, last = minutes[0], minutes[-1]
    even = _even(minutes, 60)
    if minutes == _ALL_MINUTES:
        return "every minute"
    if len(minutes) == 1:
        return "every hour, on the hour" if first == 0 else f"every hour at minute {first}"
    if even and first == 0:
        return f"every {even} minutes"
    if len(minutes) <= _LISTED:
        return f"at minutes {_and([str(m) for m in minutes])} of every hour"
    if step := _step(minutes):
        return f"every {step} minutes from minute {first} through {last} of every hour"
    return None


def _in_hours_from(start: int, end: int, minutes: Sequence[int]) -> str | None:
    """The minutes it fires at in each hour from ``start`` through ``end``, or None where no
    short phrase says them."""
    first, last = minutes[0], minutes[-1]
    if minutes == _ALL_MINUTES:
        return f"every minute from {_hhmm(start, 0)} through {_hhmm(end, 59)}"
    if len(minutes) == 1:
        return f"every hour from {_hhmm(start, first)} through {_hhmm(end, first)}"
    if even := _even(minutes, 60):
        return f"every {even} minutes from {_hhmm(start, first)} through {_hhmm(end, last)}"
    return None


def _only_days_of_month(expr: CronExpr) -> bool:
    """Only the day of the month decides the day: the weekday field lets every day by, and
    does not widen it to every day (both fields restricted: either matches)."""
    either = expr.dom_restricted and expr.dow_restricted
    return expr.days != _ALL_DAYS and expr.weekdays == _ALL_WEEKDAYS and not either


def _days(expr: CronExpr) -> str:
    """Which days it fires, after cronie: both day fields restricted (neither begins with
    ``*``), a day matching either fires; otherwise a day must match both (``*/7`` with a
    weekday: that weekday, on those days of the month). "" for every day."""
    days, weekdays = expr.days, expr.weekdays
    if expr.dom_restricted and expr.dow_restricted:
        if days == _ALL_DAYS or weekdays == _ALL_WEEKDAYS:
            return ""  # (either field matches every day)
        return f" on {_month_days(days)} and every {_and(_weekday_runs(weekdays))}"
    if weekdays == _ALL_WEEKDAYS:
        return "" if days == _ALL_DAYS else f" on {_month_days(days)}"
    runs = _weekday_runs(weekdays)
    if days != _ALL_DAYS:
        return f" on {_month_days(days)} if it is a {_and(runs, 'or')}"
    if len(runs) == 1 and "through" in runs[0]:
        return f", {runs[0]}"
    return f" every {_and(runs)}"


def _weekday_runs(weekdays: frozenset[int]) -> list[str]:
    order = [_WEEK.index(d) for d in sorted(weekdays, key=_WEEK.index)]
    return _runs(order, lambda i: _DAY_NAMES[_WEEK[i]])


def _month_days(days: frozenset[int]) -> str:
    ordered = sorted(days)
    if len(ordered) == 1:
        return f"day {ordered[0]} of the month"
    runs = _runs(ordered, str)
    if len(runs) <= _LISTED:
        return f"days {_and(runs)} of the month"
    if step := _step(ordered):
        nth = "other" if step == 2 else f"{step}rd" if step == 3 else f"{step}th"
        return f"every {nth} day of the month ({ordered[0]}, {ordered[1]}, …, {ordered[-1]})"
    return f"{len(ordered)} chosen days of the month"

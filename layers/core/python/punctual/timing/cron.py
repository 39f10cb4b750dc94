"""Five-field cron expressions, parsed into value sets with cronie's day rule.

Only the calendar is here: which local wall-clock minutes match. Mapping wall
times to instants (DST gaps and repeated hours) lives in ``zones`` and
``engine``.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}

# (field name, lowest, highest, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTH_NAMES),
    ("day-of-week", 0, 7, _DOW_NAMES),
)

# Longest day-of-month each month can have (February counts its leap day).
_MONTH_MAX_DAY = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(ValueError):
    """A cron expression that cannot be accepted; the message says why."""


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed expression: sorted value sets plus cronie's restriction flags."""

    source: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday; a 7 in the source is folded into 0
    dom_restricted: bool
    dow_restricted: bool

    def matches_date(self, day: date) -> bool:
        """Whether cron would run on this local calendar date (cronie's DOM/DOW rule)."""
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.days
        dow_ok = (day.isoweekday() % 7) in self.weekdays
        if self.dom_restricted and self.dow_restricted:
            return dom_ok or dow_ok
        return dom_ok and dow_ok


def parse_cron(expression: str) -> CronExpr:
    """Parse a 5-field expression or macro; raise CronError naming the field and reason."""
    text = " ".join(expression.split())
    if not text:
        raise CronError("expression is empty")
    if text.startswith("@"):
        expanded = MACROS.get(text.lower())
        if expanded is None:
            known = " ".join(sorted(MACROS))
            raise CronError(f"unknown macro {text!r}; known macros: {known}")
        fields = expanded.split()
    else:
        fields = text.split(" ")
    if len(fields) != 5:
        raise CronError(
            f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    sets = [
        _parse_field(raw, name, low, high, names)
        for raw, (name, low, high, names) in zip(fields, _FIELDS, strict=True)
    ]
    weekdays = frozenset(0 if d == 7 else d for d in sets[4])
    expr = CronExpr(
        source=text,
        minutes=tuple(sorted(sets[0])),
        hours=tuple(sorted(sets[1])),
        days=frozenset(sets[2]),
        months=frozenset(sets[3]),
        weekdays=weekdays,
        # cronie: a field that begins with '*' is unrestricted, even '*/2'.
        dom_restricted=not fields[2].startswith("*"),
        dow_restricted=not fields[4].startswith("*"),
    )
    _reject_never_firing(expr)
    return expr


def _parse_field(raw: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    values: set[int] = set()
    for item in raw.split(","):
        if not item:
            raise CronError(f"{name} field {raw!r}: empty list item")
        values.update(_parse_item(item, name, low, high, names))
    return values


def _parse_item(item: str, name: str, low: int, high: int, names: dict[str, int]) -> range:
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _is_number(step_text):
            raise CronError(f"{name} field: step in {item!r} must be a positive number")
        step = int(step_text)
        if step == 0:
            raise CronError(f"{name} field: step in {item!r} must be at least 1")
    if base == "*":
        return range(low, high + 1, step)
    first_text, dash, last_text = base.partition("-")
    first = _value(first_text, item, name, low, high, names)
    if dash:
        last = _value(last_text, item, name, low, high, names)
        if last < first:
            raise CronError(f"{name} field: range {base!r} runs backwards")
    else:
        # 'a/s' means from a to the end of the field in steps of s, as most crons read it.
        last = high if slash else first
    return range(first, last + 1, step)


def _value(text: str, item: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    lowered = text.lower()
    if lowered in names:
        return names[lowered]
    if not _is_number(text):
        raise CronError(f"{name} field: {text!r} in {item!r} is not a number or a known name")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{name} field: {value} in {item!r} is outside {low}-{high}")
    return value


def _is_number(text: str) -> bool:
    # ASCII only: str.isdigit() also accepts '²' and other digits int() cannot read.
    return text.isascii() and text.isdigit()


def _reject_never_firing(expr: CronExpr) -> None:
    # When the day-of-month set decides alone or together with the weekday (AND),
    # the expression can fire only if some chosen month has one of the chosen days.
    # Every valid date falls on every weekday within the 400-year Gregorian cycle, so
    # the weekday never makes an otherwise valid date impossible. With both fields
    # restricted (OR), any weekday match fires, so those expressions always fire.
    if expr.dom_restricted and expr.dow_restricted:
        return
    if any(d <= _MONTH_MAX_DAY[m - 1] for m in expr.months for d in expr.days):
        return
    raise CronError(
        f"{expr.source!r} can never fire: no chosen month has any of the chosen days of the month"
    )


def days_in_month(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]

"""The console's rules in plain English (devtools/punctual_local/console.py), in the cron
dialect of docs/time.md: lists, ranges, steps, names, macros, and cronie's rule for the two
day fields. What is too intricate to say well is said generically, never wrongly."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from punctual.timing import CronError, parse_cron
from punctual_local.words import cron_in_words, rule_in_words

CASES = [
    # every minute, steps of minutes
    ("* * * * *", "every minute"),
    ("*/5 * * * *", "every 5 minutes"),
    ("0/30 * * * *", "every 30 minutes"),
    # a step that does not divide the hour: not "every 7 minutes" across :56 -> :00
    ("*/7 * * * *", "every 7 minutes from minute 0 through 56 of every hour"),
    ("1/2 * * * *", "every 2 minutes from minute 1 through 59 of every hour"),
    ("5/15 * * * *", "at minutes 5, 20, 35 and 50 of every hour"),
    ("0,20,45 * * * *", "at minutes 0, 20 and 45 of every hour"),
    # hourly
    ("@hourly", "every hour, on the hour"),
    ("0 * * * *", "every hour, on the hour"),
    ("15 * * * *", "every hour at minute 15"),
    ("15 9-17 * * *", "every hour from 09:15 through 17:15"),
    ("0 */2 * * *", "every 2 hours from 00:00 through 22:00"),
    ("30 9-17/4 * * *", "at 09:30, 13:30 and 17:30 every day"),
    # ranges of hours with minutes
    ("* 9 * * *", "every minute from 09:00 through 09:59"),
    ("*/15 9-17 * * *", "every 15 minutes from 09:00 through 17:45"),
    ("0,30 9-17 * * *", "every 30 minutes from 09:00 through 17:30"),
    # times of day
    ("30 2 * * *", "at 02:30 every day"),
    ("@daily", "at 00:00 every day"),
    ("@midnight", "at 00:00 every day"),
    ("0 9,17 * * *", "at 09:00 and 17:00 every day"),
    # days of the week: numbers, names (any case), 7 as Sunday, ranges, lists, steps
    ("0 9 * * 1-5", "at 09:00, Monday through Friday"),
    ("0 9 * * MON-FRI", "at 09:00, Monday through Friday"),
    ("0 9 * * mon,wed,FRI", "at 09:00 every Monday, Wednesday and Friday"),
    ("0 0 * * sat,sun", "at 00:00 every Saturday and Sunday"),
    ("0 0 * * 5-7", "at 00:00, Friday through Sunday"),
    ("0 0 * * 7", "at 00:00 every Sunday"),
    ("@weekly", "at 00:00 every Sunday"),
    ("0 0 * * */2", "at 00:00 every Tuesday, Thursday, Saturday and Sunday"),
    ("0 * * * 1-5", "every hour, on the hour, Monday through Friday"),
    # days of the month
    ("30 2 1 * *", "at 02:30 on day 1 of the month"),
    ("@monthly", "at 00:00 on day 1 of the month"),
    ("0 0 1,15 * *", "at 00:00 on days 1 and 15 of the month"),
    ("0 0 1-7 * *", "at 00:00 on days 1 through 7 of the month"),
    ("0 0 1-3,20 * *", "at 00:00 on days 1 through 3 and 20 of the month"),
    ("0 0 */2 * *", "at 00:00 on every other day of the month (1, 3, …, 31)"),
    # months: names, ranges, lists; a single date
    ("@yearly", "at 00:00 on January 1"),
    ("@annually", "at 00:00 on January 1"),
    ("0 0 29 2 *", "at 00:00 on February 29"),
    ("0 12 * JAN,apr,Jul,OCT *", "at 12:00 every day in January, April, July and October"),
    ("0 8 * jan-mar fri", "at 08:00 every Friday in January through March"),
    ("0 0 1 1,7 *", "at 00:00 on day 1 of the month in January and July"),
    # both day fields restricted: cronie fires on a day matching either
    ("0 0 13 * 5", "at 00:00 on day 13 of the month and every Friday"),
    ("0 0 1,15 * MON", "at 00:00 on days 1 and 15 of the month and every Monday"),
    ("0 0 1 1 0-6", "at 00:00 every day in January"),  # (every weekday: every day)
    ("0 0 1-31 * 1", "at 00:00 every day"),
    # a day field beginning with * is unrestricted: then a day must match both
    ("0 0 */7 * 5", "at 00:00 on days 1, 8, 15, 22 and 29 of the month if it is a Friday"),
    (
        "0 0 13 * */2",
        "at 00:00 on day 13 of the month if it is a Tuesday, Thursday, Saturday or Sunday",
    ),
    # too intricate for a short phrase: generic, and still true
    ("0,15,20 1,5,9,13 * * *", "12 times a day"),
    ("0 0 1,3,5,10,12,14,20,22 * *", "at 00:00 on 8 chosen days of the month"),
    ("0,45 9-17 * * *", "18 times a day"),
]


@pytest.mark.parametrize(("expression", "words"), CASES)
def test_cron_in_words_says_the_expression(expression: str, words: str):
    assert cron_in_words(expression) == words


def test_cron_in_words_refuses_what_the_api_refuses():
    for expression in ("0 0 L * *", "@reboot", "0 0 30 2 *", "60 * * * *", "* * * *"):
        with pytest.raises(CronError):
            cron_in_words(expression)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"kind": "rate", "expression": "rate(15 minutes)"}, "every 15 minutes"),
        ({"kind": "rate", "expression": "rate(1 minute)"}, "every minute"),
        ({"kind": "rate", "expression": "rate(120 minutes)"}, "every 2 hours"),
        ({"kind": "rate", "expression": "rate(90 minutes)"}, "every 90 minutes"),
        ({"kind": "rate", "expression": "rate(1 hour)"}, "every hour"),
        ({"kind": "rate", "expression": "rate(2 days)"}, "every 2 days"),
        ({"kind": "at", "at": "2030-01-15T09:00:00", "timezone": "Asia/Tokyo"}, "once"),
        (
            {"kind": "cron", "expression": "0 9 * * 1-5", "timezone": "UTC"},
            "at 09:00, Monday through Friday",
        ),
        # (a rule the console cannot read gets no words rather than wrong ones)
        ({"kind": "cron", "expression": "0 0 ? * MON"}, None),
        ({"kind": "rate", "expression": "rate(0 minutes)"}, None),
        ({"kind": "weekly"}, None),
    ],
)
def test_rule_in_words_says_each_kind(spec: dict[str, str], words: str | None):
    assert rule_in_words(spec) == words


# --- the times of day, against what the expression's own sets say -----------------------


def _field(draw: st.DrawFn, high: int) -> str:
    """One cron field over 0..high: *, */s, a/s, a-b, a-b/s, or a list."""
    kind = draw(st.sampled_from(["*", "*/s", "a/s", "a-b", "a-b/s", "list", "n"]))
    a = draw(st.integers(0, high))
    b = draw(st.integers(a, high))
    s = draw(st.integers(1, high))
    if kind == "list":
        return ",".join(map(str, sorted(draw(st.sets(st.integers(0, high), min_size=1)))))
    return {"*": "*", "*/s": f"*/{s}", "a/s": f"{a}/{s}", "a-b": f"{a}-{b}"}.get(
        kind, f"{a}-{b}/{s}" if kind == "a-b/s" else str(a)
    )


@st.composite
def times_of_day(draw: st.DrawFn) -> str:
    return f"{_field(draw, 59)} {_field(draw, 23)} * * *"


def _said_times(words: str) -> set[tuple[int, int]] | int:
    """The (hour, minute)s a time-of-day phrase of the console says (its count, for the
    generic "N times a day")."""
    every = {(h, m) for h in range(24) for m in range(60)}
    day = [(h, m) for h in range(24) for m in range(60)]
    number = r"(\d+)"
    clock = r"(\d\d):(\d\d)"
    patterns: list[tuple[str, Any]] = [
        (r"every minute", lambda: every),
        (rf"every {number} minutes", lambda s: {t for t in every if t[1] % int(s) == 0}),
        (r"every hour, on the hour", lambda: {t for t in every if t[1] == 0}),
        (rf"every hour at minute {number}", lambda m: {t for t in every if t[1] == int(m)}),
        (
            rf"every {number} minutes from minute {number} through {number} of every hour",
            lambda s, a, b: {t for t in every if t[1] in range(int(a), int(b) + 1, int(s))},
        ),
        (
            rf"every minute from {clock} through {clock}",
            lambda h0, _a, h1, _b: {t for t in every if int(h0) <= t[0] <= int(h1)},
        ),
        (
            rf"every hour from {clock} through {clock}",
            lambda h0, m, h1, _m: {
                t for t in every if int(h0) <= t[0] <= int(h1) and t[1] == int(m)
            },
        ),
        (
            rf"every {number} minutes from {clock} through {clock}",
            lambda s, h0, a, h1, b: set(
                day[day.index((int(h0), int(a))) : day.index((int(h1), int(b))) + 1 : int(s)]
            ),
        ),
        (
            rf"every {number} hours from {clock} through {clock}",
            lambda k, h0, m, h1, _m: {(h, int(m)) for h in range(int(h0), int(h1) + 1, int(k))},
        ),
    ]
    if words.startswith("at minutes "):
        listed = words.removeprefix("at minutes ").removesuffix(" of every hour")
        minutes = {int(m) for m in re.split(r", | and ", listed)}
        return {t for t in every if t[1] in minutes}
    if words.startswith("at "):
        return {(int(h), int(m)) for h, m in re.findall(clock, words.removesuffix(" every day"))}
    if found := re.fullmatch(rf"{number} times a day", words):
        return int(found[1])
    for pattern, said in patterns:
        if found := re.fullmatch(pattern, words):
            return set(said(*found.groups()))
    raise AssertionError(f"a phrase the test does not read: {words!r}")


@settings(max_examples=2000, deadline=None)
@given(times_of_day())
def test_the_times_of_day_said_are_the_expressions(expression: str):
    # GIVEN any minute and hour fields of the dialect (every day)
    try:
        expr = parse_cron(expression)
    except CronError:
        return
    # WHEN said in words, THEN the words name exactly its times (or count them)
    said = _said_times(cron_in_words(expression))
    if isinstance(said, int):
        assert said == len(expr.minutes) * len(expr.hours)
    else:
        assert said == {(h, m) for h in expr.hours for m in expr.minutes}


# --- the days, against the expression's own rule on every date of two years -------------

_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_WEEK = [1, 2, 3, 4, 5, 6, 0]  # the order the console names weekdays in
_MONTHS = [
    *("January", "February", "March", "April", "May", "June", "July"),
    *("August", "September", "October", "November", "December"),
]
_DATES = [date(2027, 1, 1) + timedelta(days=n) for n in range(731)]


def _pieces(text: str, names: list[str], order: list[int]) -> set[int]:
    """ "Monday through Wednesday, Friday and Sunday" as values (``order``: the sequence
    "through" walks)."""
    values: set[int] = set()
    for piece in re.split(r", | and | or ", text):
        first, _, last = piece.partition(" through ")
        a, b = order.index(names.index(first)), order.index(names.index(last or first))
        values.update(order[a : b + 1])
    return values


def _month_days(text: str) -> set[int] | int:
    if found := re.fullmatch(r"day (\d+) of the month", text):
        return {int(found[1])}
    if found := re.fullmatch(r"days (.+) of the month", text):
        days = [str(d) for d in range(32)]
        return _pieces(found[1], days, list(range(32)))
    if found := re.fullmatch(r"every \w+ day of the month \((\d+), (\d+), …, (\d+)\)", text):
        a, b, z = (int(n) for n in found.groups())
        return set(range(a, z + 1, b - a))
    if found := re.fullmatch(r"(\d+) chosen days of the month", text):
        return int(found[1])
    raise AssertionError(f"a phrase the test does not read: {text!r}")


def _said_dates(words: str) -> set[date] | None:
    """The dates a phrase of the console says (None: it says only how many days of the
    month, generically)."""
    rest = words.removeprefix("at 00:00")
    months = set(range(1, 13))
    if " in " in rest:
        rest, _, named = rest.rpartition(" in ")
        months = {m + 1 for m in _pieces(named, _MONTHS, list(range(12)))}
    weekdays = set(range(7))
    days: set[int] | int = set(range(1, 32))
    either = False
    if found := re.fullmatch(r" on (\w+) (\d+)", rest):
        months, days = {_MONTHS.index(found[1]) + 1}, {int(found[2])}
    elif rest == " every day":
        pass
    elif rest.startswith(", "):
        weekdays = _pieces(rest[2:], _DAYS, _WEEK)
    elif rest.startswith(" every "):
        weekdays = _pieces(rest[7:], _DAYS, _WEEK)
    elif found := re.fullmatch(r" on (.+?)(?: (and every|if it is a) (.+))?", rest):
        days = _month_days(found[1])
        if found[2]:
            weekdays = _pieces(found[3], _DAYS, _WEEK)
            either = found[2] == "and every"
    else:
        raise AssertionError(f"a phrase the test does not read: {words!r}")
    if isinstance(days, int):
        return None
    return {
        d
        for d in _DATES
        if d.month in months
        and (
            (d.day in days or d.isoweekday() % 7 in weekdays)
            if either
            else (d.day in days and d.isoweekday() % 7 in weekdays)
        )
    }


@st.composite
def days_of_the_year(draw: st.DrawFn) -> str:
    """Day of month, month and weekday fields, numbers or names, at 00:00."""
    value = r"(?<!/)\b\d+\b"  # a number that is not a step
    day = re.sub(value, lambda n: str(int(n[0]) + 1), _field(draw, 30))  # (1-31)
    month = re.sub(value, lambda n: str(int(n[0]) + 1), _field(draw, 11))  # (1-12)
    weekday = _field(draw, 7)
    if draw(st.booleans()):  # names, any case
        weekday = re.sub(value, lambda n: _DAYS[int(n[0]) % 7][:3].upper(), weekday)
        month = re.sub(value, lambda n: _MONTHS[int(n[0]) - 1][:3].lower(), month)
    return f"0 0 {day} {month} {weekday}"


@settings(max_examples=1500, deadline=None)
@given(days_of_the_year())
def test_the_days_said_are_the_expressions(expression: str):
    # GIVEN day fields of the dialect, numbers or names, either or both restricted
    try:
        expr = parse_cron(expression)
    except CronError:
        return
    # WHEN said in words, THEN the words name exactly the dates cronie fires on (or say
    # only how many days of the month, generically)
    said = _said_dates(cron_in_words(expression))
    if said is not None:
        assert said == {d for d in _DATES if expr.matches_date(d)}, expression

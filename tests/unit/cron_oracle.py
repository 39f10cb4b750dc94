"""A brute-force oracle for the time contract, independent of the engine's code.

Expressions are generated from structure, so the oracle knows the value sets
without parsing. Fires are found by visiting every UTC minute and reading the
local wall clock: a wall time that does not exist is never visited (skipped, or
with the gap policy SHIFT fired at the first second whose offset is the one after
the jump), and a wall time seen twice fires at its first visit (the earlier
instant), at its last (LAST) or at both (BOTH).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from hypothesis import strategies as st

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


@dataclass(frozen=True)
class Field:
    text: str
    values: frozenset[int]
    star: bool


@dataclass(frozen=True)
class Expr:
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field

    @property
    def text(self) -> str:
        return " ".join(f.text for f in (self.minute, self.hour, self.dom, self.month, self.dow))

    def day_matches(self, day: date) -> bool:
        if day.month not in self.month.values:
            return False
        dom_ok = day.day in self.dom.values
        dow_ok = (day.isoweekday() % 7) in {0 if v == 7 else v for v in self.dow.values}
        if self.dom.star or self.dow.star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def matches(self, wall: datetime) -> bool:
        return (
            wall.minute in self.minute.values
            and wall.hour in self.hour.values
            and self.day_matches(wall.date())
        )


def _render(value: int, names: list[str] | None, offset: int, use_name: bool) -> str:
    if names and use_name and 0 <= value - offset < len(names):
        return names[value - offset]
    return str(value)


@st.composite
def _item(draw, low: int, high: int, names: list[str] | None, offset: int):
    use_name = draw(st.booleans())
    a = draw(st.integers(low, high))
    form = draw(st.sampled_from(["value", "range", "range_step", "value_step"]))
    if form == "value":
        return _render(a, names, offset, use_name), set(range(a, a + 1))
    if form == "value_step":
        step = draw(st.integers(1, high - low + 1))
        return f"{_render(a, names, offset, use_name)}/{step}", set(range(a, high + 1, step))
    b = draw(st.integers(a, high))
    text = f"{_render(a, names, offset, use_name)}-{_render(b, names, offset, use_name)}"
    if form == "range":
        return text, set(range(a, b + 1))
    step = draw(st.integers(1, high - low + 1))
    return f"{text}/{step}", set(range(a, b + 1, step))


@st.composite
def field(
    draw, low: int, high: int, names: list[str] | None = None, offset: int = 0, stars: int = 1
):
    # ``stars`` weighs '*' up: day fields are '*' in most real expressions, and a
    # restricted day rarely meets the one date of a zone transition.
    form = draw(st.sampled_from(["star"] * stars + ["star_step", "list", "list"]))
    if form == "star":
        return Field("*", frozenset(range(low, high + 1)), True)
    if form == "star_step":
        step = draw(st.integers(1, high - low + 1))
        return Field(f"*/{step}", frozenset(range(low, high + 1, step)), True)
    items = draw(st.lists(_item(low, high, names, offset), min_size=1, max_size=3))
    values: set[int] = set()
    for _, item_values in items:
        values |= item_values
    return Field(",".join(text for text, _ in items), frozenset(values), False)


@st.composite
def expressions(draw) -> Expr:
    return Expr(
        minute=draw(field(0, 59)),
        hour=draw(field(0, 23, stars=2)),
        dom=draw(field(1, 31, stars=4)),
        month=draw(field(1, 12, MONTHS, 1, stars=4)),
        dow=draw(field(0, 7, DAYS, 0, stars=4)),
    )


def can_ever_fire(expr: Expr) -> bool:
    """Brute force over one whole 400-year Gregorian cycle."""
    day = date(2000, 1, 1)
    end = date(2400, 1, 1)
    one = timedelta(days=1)
    while day < end:
        if expr.day_matches(day):
            return True
        day += one
    return False


def oracle_fires(
    expr: Expr,
    zone: ZoneInfo,
    after: int,
    until: int,
    gap: str = "SKIP",
    repeat: str = "FIRST",
) -> list[int]:
    """Fires in (after, until] by visiting every UTC minute (offsets are whole minutes),
    under a DST policy given by its names."""
    visits: dict[datetime, list[int]] = {}
    fires: set[int] = set()
    first_minute = (after - 30 * 3600) // 60 * 60  # a day and more of history: repeats
    last_minute = until + 30 * 3600  # and of future: a repeat's last visit
    previous: tuple[int, datetime] | None = None
    for instant in range(first_minute, last_minute + 1, 60):
        wall = datetime.fromtimestamp(instant, zone).replace(tzinfo=None)
        visits.setdefault(wall, []).append(instant)
        if gap == "SHIFT" and previous is not None and wall - previous[1] > timedelta(minutes=1):
            # The clocks jumped: every wall minute between was never shown.
            skipped = previous[1] + timedelta(minutes=1)
            while skipped < wall:
                if expr.matches(skipped):
                    fires.add(jump_instant(zone, previous[0], instant))
                skipped += timedelta(minutes=1)
        previous = (instant, wall)
    for wall, instants in visits.items():
        if expr.matches(wall):
            fires.update(choose(instants, repeat))
    return sorted(f for f in fires if after < f <= until)


def choose(instants: list[int], repeat: str) -> list[int]:
    """The visits of one wall time that fire under the repeat policy named."""
    if repeat == "FIRST":
        return instants[:1]
    if repeat == "LAST":
        return instants[-1:]
    return instants


def jump_instant(zone: ZoneInfo, before: int, at: int) -> int:
    """The first second in (before, at] whose UTC offset is ``at``'s: where the clocks
    jumped ahead."""
    offset = datetime.fromtimestamp(at, zone).utcoffset()
    lo, hi = before, at
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == offset:
            hi = middle
        else:
            lo = middle
    return hi


@cache
def transitions(zone_name: str, zone: ZoneInfo) -> tuple[int, ...]:
    """Instants (to the second) where the zone's UTC offset changes, 1973-2037."""
    found = []
    step = 7 * 86400
    start = int(datetime(1973, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(2037, 12, 31, tzinfo=UTC).timestamp())

    def offset(t: int) -> timedelta | None:
        return datetime.fromtimestamp(t, zone).utcoffset()

    t = start
    while t < end:
        if offset(t) != offset(t + step):
            lo, hi = t, t + step
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if offset(mid) == offset(lo):
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        t += step
    return tuple(found)


def _star(low: int, high: int) -> Field:
    return Field("*", frozenset(range(low, high + 1)), True)


@st.composite
def hourly_expressions(draw) -> Expr:
    """Expressions with a wall time in every hour (a generated one rarely has one in the
    hour a transition skips or repeats): '*', '*/15', '0', '30', '0,30', '45' minutes."""
    minute = draw(st.sampled_from(["*", "*/15", "0", "30", "0,30", "45"]))
    values = range(60) if minute == "*" else range(0, 60, 15) if minute == "*/15" else ()
    chosen = frozenset(values) or frozenset(int(m) for m in minute.split(","))
    return Expr(
        minute=Field(minute, chosen, minute.startswith("*")),
        hour=_star(0, 23),
        dom=_star(1, 31),
        month=_star(1, 12),
        dow=_star(0, 7),
    )

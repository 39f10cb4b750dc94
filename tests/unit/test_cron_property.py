"""Property tests: the cron engine against the brute-force oracle, in every zone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from punctual.timing import CronError, CronRule, get_zone, parse_cron
from punctual.timing.zones import zone_names
from tests.unit.cron_oracle import Expr, can_ever_fire, expressions, oracle_fires, transitions

ALL_ZONES = sorted(zone_names())
LOW = int(datetime(1973, 1, 1, tzinfo=UTC).timestamp())
HIGH = int(datetime(2037, 12, 1, tzinfo=UTC).timestamp())
WINDOW = 2 * 86400


@st.composite
def zone_and_start(draw) -> tuple[str, int]:
    """A zone from the whole tz database and a start, usually close to one of its transitions."""
    name = draw(st.sampled_from(ALL_ZONES))
    found = transitions(name, get_zone(name))
    if found and draw(st.integers(0, 4)) > 0:
        near = draw(st.sampled_from(found))
        return name, near + draw(st.integers(-36 * 3600, 36 * 3600))
    return name, draw(st.integers(LOW, HIGH))


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@SETTINGS
@given(expr=expressions(), where=zone_and_start())
def test_cron_fires_match_brute_force_oracle_around_transitions(
    expr: Expr, where: tuple[str, int]
) -> None:
    # GIVEN an expression that can fire, a zone and a start near one of its transitions
    assume(can_ever_fire(expr))
    name, after = where
    zone = get_zone(name)
    rule = CronRule(parse_cron(expr.text), zone)
    # WHEN the engine plans two days after the start
    fires = rule.fires(after, after + WINDOW)
    # THEN it fires exactly where the oracle does: gaps skipped, repeats once, all > start
    expected = oracle_fires(expr, zone, after, after + WINDOW)
    assert list(fires) == expected
    # AND its next fire is the oracle's first (read from the start's day window, or walked)
    if expected:
        assert rule.next_after(after) == expected[0]


@SETTINGS
@given(
    expr=expressions(),
    where=zone_and_start(),
    cut=st.integers(1, WINDOW - 1),
)
def test_cron_windows_compose_without_gap_or_overlap(
    expr: Expr, where: tuple[str, int], cut: int
) -> None:
    # GIVEN one window split at an arbitrary instant
    assume(can_ever_fire(expr))
    name, after = where
    rule = CronRule(parse_cron(expr.text), get_zone(name))
    # WHEN both halves are planned separately
    halves = rule.fires(after, after + cut) + rule.fires(after + cut, after + WINDOW)
    # THEN together they are exactly the whole window: no fire lost or doubled at the seam
    assert halves == rule.fires(after, after + WINDOW)


@settings(max_examples=200, deadline=None)
@given(expr=expressions())
def test_parse_cron_rejects_exactly_the_expressions_that_never_fire(expr: Expr) -> None:
    # GIVEN any well-formed expression; WHEN it is parsed
    # THEN it is accepted if and only if some date in a 400-year cycle matches
    if can_ever_fire(expr):
        parse_cron(expr.text)
    else:
        with pytest.raises(CronError, match="can never fire"):
            parse_cron(expr.text)

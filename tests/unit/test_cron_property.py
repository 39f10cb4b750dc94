"""Property tests: the cron engine against the brute-force oracle, in every zone."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from punctual.timing import (
    DEFAULT_DST,
    CronError,
    CronRule,
    DstPolicy,
    Gap,
    Repeat,
    get_zone,
    parse_cron,
)
from punctual.timing.zones import zone_names
from tests.unit.cron_oracle import (
    Expr,
    can_ever_fire,
    expressions,
    hourly_expressions,
    oracle_fires,
    transitions,
)

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


# Every DST policy (docs/time.md, *Daylight saving: the choice per schedule*), the default
# drawn as often as all the others together.
POLICIES = st.one_of(
    st.just(DEFAULT_DST), st.builds(DstPolicy, st.sampled_from(Gap), st.sampled_from(Repeat))
)

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@SETTINGS
@given(expr=expressions(), where=zone_and_start(), dst=POLICIES)
def test_cron_fires_match_brute_force_oracle_around_transitions(
    expr: Expr, where: tuple[str, int], dst: DstPolicy
) -> None:
    # GIVEN an expression that can fire, a zone, a start near one of its transitions and a
    # DST policy
    assume(can_ever_fire(expr))
    name, after = where
    zone = get_zone(name)
    rule = CronRule(parse_cron(expr.text), zone, dst=dst)
    # WHEN the engine plans two days after the start
    fires = rule.fires(after, after + WINDOW)
    # THEN it fires exactly where the oracle does: gaps skipped or shifted to their end,
    # repeats once (first or last) or twice, all > start
    expected = oracle_fires(expr, zone, after, after + WINDOW, dst.gap.value, dst.repeat.value)
    assert list(fires) == expected
    # AND its next fire is the oracle's first (read from the start's day window, or walked)
    if expected:
        assert rule.next_after(after) == expected[0]


@st.composite
def just_before_a_transition(draw) -> tuple[str, int]:
    """A zone that has transitions and a start up to three hours before one of them."""
    name = draw(st.sampled_from(ALL_ZONES))
    found = transitions(name, get_zone(name))
    assume(found)
    return name, draw(st.sampled_from(found)) - draw(st.integers(0, 3 * 3600))


@SETTINGS
@given(
    expr=hourly_expressions(),
    where=just_before_a_transition(),
    dst=st.builds(DstPolicy, st.sampled_from(Gap), st.sampled_from(Repeat)),
)
def test_every_dst_policy_matches_the_oracle_across_a_transition(
    expr: Expr, where: tuple[str, int], dst: DstPolicy
) -> None:
    # GIVEN an expression with a wall time in every hour, a start just before a transition
    # of any zone (a gap, a repeated hour, or an offset change of another kind), and a policy
    name, after = where
    zone = get_zone(name)
    rule = CronRule(parse_cron(expr.text), zone, dst=dst)
    # WHEN the engine plans the six hours around the transition, and walks them fire by fire
    fires = rule.fires(after, after + 6 * 3600)
    walked = []
    fire = rule.next_after(after)
    while fire is not None and fire <= after + 6 * 3600:
        walked.append(fire)
        fire = rule.next_after(fire)
    # THEN both are the oracle's fires: the gap's wall times skipped or fired at its end, the
    # repeated ones at their first, last or both instants
    expected = oracle_fires(expr, zone, after, after + 6 * 3600, dst.gap.value, dst.repeat.value)
    assert list(fires) == expected
    assert walked == expected


@SETTINGS
@given(
    expr=expressions(),
    where=zone_and_start(),
    cut=st.integers(1, WINDOW - 1),
    dst=POLICIES,
)
def test_cron_windows_compose_without_gap_or_overlap(
    expr: Expr, where: tuple[str, int], cut: int, dst: DstPolicy
) -> None:
    # GIVEN one window split at an arbitrary instant, under any DST policy
    assume(can_ever_fire(expr))
    name, after = where
    rule = CronRule(parse_cron(expr.text), get_zone(name), dst=dst)
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


# Everyday expressions beside the generated ones: each has a wall time in most repeated
# hours (a generated one often has none there).
EVERYDAY = ["* * * * *", "*/15 * * * *", "0 * * * *", "30 * * * *", "45 1,2 * * *", "@daily"]


@cache
def fall_backs(name: str) -> tuple[tuple[int, int], ...]:
    """(instant, seconds the clocks go back) of each of the zone's fall-backs, 1973-2037."""
    zone = get_zone(name)
    found = []
    for instant in transitions(name, zone):
        before = datetime.fromtimestamp(instant - 1, zone).utcoffset()
        after = datetime.fromtimestamp(instant, zone).utcoffset()
        assert before is not None
        assert after is not None
        if after < before:
            found.append((instant, int((before - after).total_seconds())))
    return tuple(found)


@st.composite
def inside_a_repeated_hour(draw) -> tuple[str, int]:
    """A zone that has fall-backs and an instant in one of them: while its clocks show the
    repeated wall times a second time."""
    name = draw(st.sampled_from(ALL_ZONES))
    found = fall_backs(name)
    assume(found)
    instant, back = draw(st.sampled_from(found))
    return name, instant + draw(st.integers(0, back - 1))


@SETTINGS
@given(
    expr=st.one_of(
        st.sampled_from(EVERYDAY),
        expressions().filter(can_ever_fire).map(lambda e: e.text),
    ),
    where=inside_a_repeated_hour(),
    span=st.integers(1, WINDOW),
    dst=POLICIES,
)
# Adelaide's 02:15 ACST on 2026-04-05 (16:45Z): 02:30 and 02:45 fired at 16:00Z and 16:15Z.
@example(expr="*/15 * * * *", where=("Australia/Adelaide", 1775321100), span=3600, dst=DEFAULT_DST)
def test_cron_fires_until_inside_a_repeated_hour_equal_the_next_after_walk(
    expr: str, where: tuple[str, int], span: int, dst: DstPolicy
) -> None:
    # GIVEN a window (after, until] whose end lies inside a repeated hour, in its second pass
    # (the clocks show its wall times again, the earlier instants of which fired already),
    # under any DST policy
    name, until = where
    after = until - span
    rule = CronRule(parse_cron(expr), get_zone(name), dst=dst)
    # WHEN the engine plans the window, and walks it fire by fire
    walked = []
    fire = rule.next_after(after)
    while fire is not None and fire <= until:
        walked.append(fire)
        fire = rule.next_after(fire)
    # THEN both give the same fires: none of the first pass's lost for lying at wall times
    # after the end's (the reconciler plans its hours by windows, the materializer by steps)
    assert list(rule.fires(after, until)) == walked

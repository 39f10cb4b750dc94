"""Rate and one-shot rules, resolve_at, and Bounds on every rule kind.

Expected instants were worked out by hand from the zone rules (Europe/Berlin
switches at 01:00 UTC on 2026-03-29; America/New_York springs forward at 07:00 UTC
on 2026-03-08 and falls back at 06:00 UTC on 2026-11-01).
"""

from __future__ import annotations

import itertools
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from punctual.timing import (
    Bounds,
    CronRule,
    OneShotRule,
    RateRule,
    ZoneError,
    get_zone,
    local_text,
    parse_cron,
    parse_rate,
    resolve_at,
    utc_text,
)

MINUTE, HOUR, DAY = 60, 3600, 86400


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


# --- parse_rate ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "seconds"),
    [
        pytest.param("rate(15 minutes)", 15 * MINUTE, id="minutes"),
        pytest.param("rate(1 minute)", MINUTE, id="one_minute"),
        pytest.param("rate(1 minutes)", MINUTE, id="one_minutes_plural_ok"),
        pytest.param("rate(5 minute)", 5 * MINUTE, id="five_minute_singular_ok"),
        pytest.param("rate(2 hours)", 2 * HOUR, id="hours"),
        pytest.param("rate(1 hour)", HOUR, id="one_hour"),
        pytest.param("rate(1 day)", DAY, id="one_day"),
        pytest.param("rate(3 days)", 3 * DAY, id="days"),
        pytest.param("RATE(15 MINUTES)", 15 * MINUTE, id="upper_case"),
        pytest.param("Rate(2 Hours)", 2 * HOUR, id="title_case"),
        pytest.param("  rate( 15   minutes )  ", 15 * MINUTE, id="whitespace"),
        pytest.param("rate(\t1\tday\t)", DAY, id="tabs"),
        pytest.param("rate(015 minutes)", 15 * MINUTE, id="leading_zero"),
        pytest.param("rate(366 days)", 366 * DAY, id="max_days"),
        pytest.param("rate(8784 hours)", 366 * DAY, id="max_in_hours"),
        pytest.param("rate(527040 minutes)", 366 * DAY, id="max_in_minutes"),
    ],
)
def test_parse_rate_accepted_forms(expression: str, seconds: int):
    # GIVEN a rate expression in any accepted spelling
    # WHEN parsed
    # THEN the interval is returned in seconds
    assert parse_rate(expression) == seconds


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        pytest.param("rate(0 minutes)", "at least 1", id="zero"),
        pytest.param("rate(0 days)", "at least 1", id="zero_days"),
        pytest.param("rate(5 seconds)", "is not a rate", id="seconds_unit"),
        pytest.param("rate(1 week)", "is not a rate", id="weeks_unit"),
        pytest.param("rate(15)", "is not a rate", id="no_unit"),
        pytest.param("rate(minutes)", "is not a rate", id="no_number"),
        pytest.param("rate(-5 minutes)", "is not a rate", id="negative"),
        pytest.param("rate(1.5 hours)", "is not a rate", id="fraction"),
        pytest.param("rate(15minutes)", "is not a rate", id="no_space"),
        pytest.param("every 5 minutes", "is not a rate", id="prose"),
        pytest.param("rate(5 minutes", "is not a rate", id="unclosed"),
        pytest.param("cron(0 9 * * *)", "is not a rate", id="cron_form"),
        pytest.param("", "is not a rate", id="empty"),
        pytest.param("rate(367 days)", "at most 366 days", id="over_max_days"),
        pytest.param("rate(8785 hours)", "at most 366 days", id="over_max_hours"),
        pytest.param("rate(527041 minutes)", "at most 366 days", id="over_max_minutes"),
    ],
)
def test_parse_rate_rejects_with_reason(expression: str, reason: str):
    # GIVEN something that is not an acceptable rate
    # WHEN parsed
    with pytest.raises(ValueError, match=r"rate") as caught:
        parse_rate(expression)
    # THEN the ValueError says why and quotes the input
    assert reason in str(caught.value)
    assert repr(expression) in str(caught.value)


def test_parse_rate_error_suggests_the_syntax():
    # GIVEN prose instead of a rate; WHEN parsed
    # THEN the message shows the expected form
    with pytest.raises(ValueError, match=r"rate\(15 minutes\)"):
        parse_rate("every 15 minutes")


# --- RateRule -----------------------------------------------------------------------


def test_rate_rule_fires_are_anchor_plus_multiples():
    # GIVEN a 15-minute rate anchored at 10:07
    anchor = _epoch("2026-01-01T10:07:00Z")
    rule = RateRule(15 * MINUTE, anchor)
    # WHEN asking for fires from well before the anchor to 11:00
    fires = rule.fires(anchor - DAY, _epoch("2026-01-01T11:00:00Z"))
    # THEN the first fire is the anchor itself (k = 0), then every 15 minutes
    assert [utc_text(f) for f in fires] == [
        "2026-01-01T10:07:00Z",
        "2026-01-01T10:22:00Z",
        "2026-01-01T10:37:00Z",
        "2026-01-01T10:52:00Z",
    ]


def test_rate_rule_never_fires_before_anchor():
    # GIVEN a rate anchored in the future
    anchor = _epoch("2026-06-01T00:00:00Z")
    rule = RateRule(HOUR, anchor)
    # WHEN asking for a window that ends just before the anchor
    # THEN there is no fire (no negative k)
    assert rule.fires(anchor - 10 * DAY, anchor - 1) == ()
    assert rule.next_after(anchor - 10 * DAY) == anchor


def test_rate_rule_window_is_after_exclusive_until_inclusive():
    # GIVEN an hourly rate anchored at 00:00
    anchor = _epoch("2026-01-01T00:00:00Z")
    rule = RateRule(HOUR, anchor)
    # WHEN the window starts and ends exactly on fires
    fires = rule.fires(anchor + HOUR, anchor + 3 * HOUR)
    # THEN the fire at `after` is excluded and the one at `until` included
    assert fires == (anchor + 2 * HOUR, anchor + 3 * HOUR)


def test_rate_rule_empty_and_inverted_windows():
    # GIVEN an hourly rate
    anchor = _epoch("2026-01-01T00:00:00Z")
    rule = RateRule(HOUR, anchor)
    # WHEN the window holds no grid point, is empty, or is inverted
    # THEN there are no fires
    assert rule.fires(anchor + 1, anchor + HOUR - 1) == ()
    assert rule.fires(anchor + HOUR, anchor + HOUR) == ()
    assert rule.fires(anchor + 5 * HOUR, anchor + 2 * HOUR) == ()


def test_rate_rule_next_after_exactly_on_a_fire_returns_the_following_one():
    # GIVEN a 15-minute rate
    anchor = _epoch("2026-01-01T00:00:00Z")
    rule = RateRule(15 * MINUTE, anchor)
    # WHEN asking for the next fire at exactly a fire, and one second before it
    # THEN 'after' is strict: the fire itself only counts from before it
    assert rule.next_after(anchor) == anchor + 15 * MINUTE
    assert rule.next_after(anchor + 15 * MINUTE) == anchor + 30 * MINUTE
    assert rule.next_after(anchor + 15 * MINUTE - 1) == anchor + 15 * MINUTE


def test_rate_rule_one_day_is_blind_to_dst():
    # GIVEN a daily rate anchored at 12:00 UTC (13:00 in Berlin, CET) before the 2026-03-29 switch
    anchor = _epoch("2026-03-27T12:00:00Z")
    rule = RateRule(parse_rate("rate(1 day)"), anchor)
    berlin = get_zone("Europe/Berlin")
    # WHEN planning across the transition
    fires = rule.fires(anchor, _epoch("2026-03-31T12:00:00Z"))
    # THEN consecutive fires stay exactly 86400 s apart in UTC ...
    assert [b - a for a, b in itertools.pairwise(fires)] == [DAY] * 3
    # ... so the local wall time moves from 13:00 CET to 14:00 CEST
    assert [local_text(f, berlin) for f in fires] == [
        "2026-03-28T13:00:00+01:00",
        "2026-03-29T14:00:00+02:00",
        "2026-03-30T14:00:00+02:00",
        "2026-03-31T14:00:00+02:00",
    ]


def test_rate_rule_bounds_are_inclusive():
    # GIVEN an hourly rate with start_at and end_at exactly on fires
    anchor = _epoch("2026-01-01T00:00:00Z")
    bounds = Bounds(start=anchor + 2 * HOUR, end=anchor + 4 * HOUR)
    rule = RateRule(HOUR, anchor, bounds)
    # WHEN planning a whole day
    fires = rule.fires(anchor - HOUR, anchor + DAY)
    # THEN both bound instants fire and nothing outside them
    assert fires == (anchor + 2 * HOUR, anchor + 3 * HOUR, anchor + 4 * HOUR)


def test_rate_rule_bounds_between_grid_points():
    # GIVEN an hourly rate whose bounds fall between fires
    anchor = _epoch("2026-01-01T00:00:00Z")
    rule = RateRule(HOUR, anchor, Bounds(start=anchor + 90 * MINUTE, end=anchor + 270 * MINUTE))
    # WHEN planning a day and walking next_after
    # THEN the grid stays anchored: 02:00, 03:00, 04:00 only
    assert rule.fires(anchor, anchor + DAY) == (
        anchor + 2 * HOUR,
        anchor + 3 * HOUR,
        anchor + 4 * HOUR,
    )
    assert rule.next_after(anchor) == anchor + 2 * HOUR
    assert rule.next_after(anchor + 4 * HOUR) is None


def test_rate_rule_next_after_respects_end_bound():
    # GIVEN a rate that ends at a fire
    anchor = _epoch("2026-01-01T00:00:00Z")
    rule = RateRule(DAY, anchor, Bounds(end=anchor + 2 * DAY))
    # WHEN asking for the next fire just before and at the last one
    # THEN the last fire is offered once, then there is none
    assert rule.next_after(anchor + 2 * DAY - 1) == anchor + 2 * DAY
    assert rule.next_after(anchor + 2 * DAY) is None
    assert rule.fires(anchor + 2 * DAY, anchor + 10 * DAY) == ()


@settings(max_examples=300, deadline=None)
@given(
    interval=st.integers(1, 5000),
    anchor=st.integers(-(10**6), 10**6),
    offset=st.integers(-20, 20),
    shift=st.integers(-5000, 5000),
    span=st.integers(0, 30),
    start=st.none() | st.integers(-20, 40),
    end=st.none() | st.integers(-20, 40),
)
def test_rate_rule_fires_match_brute_force(
    interval: int,
    anchor: int,
    offset: int,
    shift: int,
    span: int,
    start: int | None,
    end: int | None,
) -> None:
    # GIVEN any rate, any window near its anchor and optional bounds
    after = anchor + offset * interval + shift
    until = after + span * interval + shift
    bounds = Bounds(
        start=None if start is None else anchor + start * interval + shift // 2,
        end=None if end is None else anchor + end * interval - shift // 3,
    )
    rule = RateRule(interval, anchor, bounds)
    # WHEN planning the window
    fires = rule.fires(after, until)
    # THEN it is exactly the anchor grid (k >= 0) inside (after, until] and [start, end]
    expected = [
        f
        for f in (anchor + k * interval for k in range(max(0, (until - anchor) // interval) + 2))
        if after < f <= until
        and (bounds.start is None or f >= bounds.start)
        and (bounds.end is None or f <= bounds.end)
    ]
    assert list(fires) == expected
    # AND next_after agrees with the first fire of the window when there is one
    if expected:
        assert rule.next_after(after) == expected[0]


# --- OneShotRule --------------------------------------------------------------------


def test_one_shot_rule_fires_once_in_half_open_window():
    # GIVEN a one-shot at noon
    at = _epoch("2026-05-01T12:00:00Z")
    rule = OneShotRule(at)
    # WHEN windows end at, start at, or straddle the instant
    # THEN it fires only in windows where after < at <= until
    assert rule.fires(at - HOUR, at) == (at,)
    assert rule.fires(at - 1, at + HOUR) == (at,)
    assert rule.fires(at, at + HOUR) == ()
    assert rule.fires(at - HOUR, at - 1) == ()


def test_one_shot_rule_next_after():
    # GIVEN a one-shot
    at = _epoch("2026-05-01T12:00:00Z")
    rule = OneShotRule(at)
    # WHEN asking before and at the instant
    # THEN it is offered strictly before, and never again after
    assert rule.next_after(at - 1) == at
    assert rule.next_after(at) is None
    assert rule.next_after(at + DAY) is None


def test_one_shot_rule_outside_bounds_never_fires():
    # GIVEN one-shots just outside and exactly on their bounds
    at = _epoch("2026-05-01T12:00:00Z")
    early = OneShotRule(at, Bounds(start=at + 1))
    late = OneShotRule(at, Bounds(end=at - 1))
    on_edges = OneShotRule(at, Bounds(start=at, end=at))
    # WHEN planning a wide window
    # THEN bounds are inclusive: only the one whose bounds include the instant fires
    assert early.fires(at - DAY, at + DAY) == ()
    assert early.next_after(at - DAY) is None
    assert late.fires(at - DAY, at + DAY) == ()
    assert late.next_after(at - DAY) is None
    assert on_edges.fires(at - DAY, at + DAY) == (at,)
    assert on_edges.next_after(at - DAY) == at


# --- resolve_at ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "zone", "expected"),
    [
        pytest.param("2026-03-07T07:30:00Z", None, "2026-03-07T07:30:00Z", id="zulu"),
        pytest.param("2026-03-07T02:30:00-05:00", None, "2026-03-07T07:30:00Z", id="offset"),
        pytest.param("2026-03-07T13:00:00+05:30", None, "2026-03-07T07:30:00Z", id="half_hour"),
        pytest.param(
            "2026-03-07T02:30:00-05:00", "Asia/Tokyo", "2026-03-07T07:30:00Z", id="offset_wins"
        ),
        pytest.param("  2026-03-07T07:30:00Z  ", None, "2026-03-07T07:30:00Z", id="padded"),
        pytest.param("2026-03-07T07:30:00.999Z", None, "2026-03-07T07:30:00Z", id="subsecond"),
        pytest.param(
            "2026-07-01T09:00:00", "Europe/Berlin", "2026-07-01T07:00:00Z", id="local_summer"
        ),
        pytest.param(
            "2026-01-01T09:00:00", "Europe/Berlin", "2026-01-01T08:00:00Z", id="local_winter"
        ),
        pytest.param(
            "2026-03-08T03:30:00", "America/New_York", "2026-03-08T07:30:00Z", id="after_gap"
        ),
        pytest.param("2026-12-24", "Asia/Kathmandu", "2026-12-23T18:15:00Z", id="date_only"),
    ],
)
def test_resolve_at_instants(text: str, zone: str | None, expected: str):
    # GIVEN an ISO date-time with an offset, or a local one plus a zone
    # WHEN resolved
    resolved = resolve_at(text, zone)
    # THEN it is the expected instant, with no ambiguity note
    assert utc_text(resolved.instant) == expected
    assert resolved.note is None


def test_resolve_at_nonexistent_local_time_rejected():
    # GIVEN 02:30 on the New York spring-forward day (clocks jump 02:00 -> 03:00)
    # WHEN resolved
    with pytest.raises(ValueError, match="does not exist") as caught:
        resolve_at("2026-03-08T02:30", "America/New_York")
    # THEN it is rejected, saying the time does not exist in that zone
    message = str(caught.value)
    assert "does not exist" in message
    assert "2026-03-08T02:30:00" in message
    assert "America/New_York" in message


def test_resolve_at_skipped_calendar_day_rejected():
    # GIVEN noon on 2011-12-30 in Apia, a day the island skipped entirely
    # WHEN resolved; THEN it does not exist either
    with pytest.raises(ValueError, match="does not exist"):
        resolve_at("2011-12-30T12:00:00", "Pacific/Apia")


def test_resolve_at_ambiguous_local_time_uses_earlier_instant_with_note():
    # GIVEN 01:30 on the New York fall-back day (01:00-02:00 happens twice)
    # WHEN resolved
    resolved = resolve_at("2026-11-01T01:30", "America/New_York")
    # THEN the earlier (EDT) instant is used ...
    assert utc_text(resolved.instant) == "2026-11-01T05:30:00Z"
    # ... and the note says it occurs twice and names the later (EST) instant
    assert resolved.note is not None
    assert "twice" in resolved.note
    assert "2026-11-01T05:30:00Z" in resolved.note
    assert "2026-11-01T06:30:00Z" in resolved.note


def test_resolve_at_ambiguous_with_explicit_offset_has_no_note():
    # GIVEN the second 01:30 written with its EST offset
    # WHEN resolved
    resolved = resolve_at("2026-11-01T01:30:00-05:00", "America/New_York")
    # THEN the offset decides: the later instant, and nothing is ambiguous
    assert utc_text(resolved.instant) == "2026-11-01T06:30:00Z"
    assert resolved.note is None


def test_resolve_at_naive_without_zone_rejected():
    # GIVEN a local date-time and no zone
    # WHEN resolved
    # THEN it is rejected: it names no instant
    with pytest.raises(ValueError, match="no UTC offset"):
        resolve_at("2026-05-01T12:00:00", None)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2026-05-01T12:00:00", id="local"),
        pytest.param("2026-05-01T12:00:00Z", id="with_offset"),
    ],
)
def test_resolve_at_bad_zone_rejected(text: str):
    # GIVEN a zone name that is not in the IANA database
    # WHEN resolved (even when the text carries its own offset)
    with pytest.raises(ZoneError) as caught:
        resolve_at(text, "Mars/Olympus_Mons")
    # THEN the ZoneError names the bad zone
    assert "'Mars/Olympus_Mons' is not an IANA time zone name" in str(caught.value)


@pytest.mark.parametrize(
    "text", ["tomorrow", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "12:00", ""]
)
def test_resolve_at_not_iso_rejected(text: str):
    # GIVEN text that is not an ISO-8601 date-time
    # WHEN resolved
    # THEN the ValueError says so
    with pytest.raises(ValueError, match="not an ISO-8601 date-time"):
        resolve_at(text, "UTC")


# --- CronRule with Bounds -----------------------------------------------------------


def test_cron_rule_bounds_clip_fires():
    # GIVEN an hourly cron limited to 05:00..08:00 (both inclusive)
    day = _epoch("2026-01-01T00:00:00Z")
    bounds = Bounds(start=day + 5 * HOUR, end=day + 8 * HOUR)
    rule = CronRule(parse_cron("0 * * * *"), get_zone("UTC"), bounds)
    # WHEN planning the whole day
    fires = rule.fires(day, day + DAY)
    # THEN only fires within the bounds remain, including both edges
    assert [utc_text(f) for f in fires] == [
        "2026-01-01T05:00:00Z",
        "2026-01-01T06:00:00Z",
        "2026-01-01T07:00:00Z",
        "2026-01-01T08:00:00Z",
    ]


def test_cron_rule_bounds_between_matches():
    # GIVEN an hourly cron whose bounds fall mid-hour
    day = _epoch("2026-01-01T00:00:00Z")
    bounds = Bounds(start=day + 5 * HOUR + 1, end=day + 8 * HOUR - 1)
    rule = CronRule(parse_cron("0 * * * *"), get_zone("UTC"), bounds)
    # WHEN planning the day
    # THEN the edge hours drop out
    assert rule.fires(day, day + DAY) == (day + 6 * HOUR, day + 7 * HOUR)


def test_cron_rule_bounds_window_outside_gives_nothing():
    # GIVEN a bounded cron
    day = _epoch("2026-01-01T00:00:00Z")
    rule = CronRule(
        parse_cron("0 * * * *"), get_zone("UTC"), Bounds(day + 5 * HOUR, day + 8 * HOUR)
    )
    # WHEN the window lies wholly before or after the bounds
    # THEN there are no fires
    assert rule.fires(day, day + 4 * HOUR) == ()
    assert rule.fires(day + 8 * HOUR, day + DAY) == ()


def test_cron_rule_next_after_respects_bounds():
    # GIVEN an hourly cron limited to 05:00..08:00
    day = _epoch("2026-01-01T00:00:00Z")
    rule = CronRule(
        parse_cron("0 * * * *"), get_zone("UTC"), Bounds(day + 5 * HOUR, day + 8 * HOUR)
    )
    # WHEN asking for the next fire before, inside and at the end of the bounds
    # THEN the start is the first fire and nothing follows the end
    assert rule.next_after(day) == day + 5 * HOUR
    assert rule.next_after(day + 6 * HOUR) == day + 7 * HOUR
    assert rule.next_after(day + 8 * HOUR) is None


def test_cron_rule_bounds_in_local_zone():
    # GIVEN a 09:00 Berlin cron bounded to two days in UTC
    start = _epoch("2026-07-02T00:00:00Z")
    end = _epoch("2026-07-03T07:00:00Z")
    rule = CronRule(parse_cron("0 9 * * *"), get_zone("Europe/Berlin"), Bounds(start, end))
    # WHEN planning a week
    fires = rule.fires(_epoch("2026-07-01T00:00:00Z"), _epoch("2026-07-08T00:00:00Z"))
    # THEN 07-02 and 07-03 09:00 CEST fire (07:00Z, the end instant itself) and no other
    assert [utc_text(f) for f in fires] == ["2026-07-02T07:00:00Z", "2026-07-03T07:00:00Z"]

"""Named DST and calendar vectors: each one a promise of the time contract.

Expected instants were worked out by hand from the zone rules (offsets checked
against the pinned tzdata), not produced by the engine.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from punctual.timing import CronRule, get_zone, parse_cron, preview, utc_text


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _next(expr: str, zone: str, after: str, count: int) -> list[str]:
    rule = CronRule(parse_cron(expr), get_zone(zone))
    fires, cursor = [], _epoch(after)
    for _ in range(count):
        instant = rule.next_after(cursor)
        assert instant is not None
        fires.append(utc_text(instant))
        cursor = instant
    return fires


VECTORS = [
    # --- US forms: spring gap 02:00-03:00, fall repeat 01:00-02:00 -------------------
    (
        "us_spring_daily_0230_skipped",
        "30 2 * * *",
        "America/New_York",
        "2026-03-06T12:00:00Z",
        ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"],
    ),
    (
        "us_spring_weekly_sunday_0200_skipped",
        "0 2 * * 0",
        "America/Los_Angeles",
        "2026-03-01T00:00:00Z",
        ["2026-03-01T10:00:00Z", "2026-03-15T09:00:00Z"],
    ),
    (
        "us_spring_every_15_in_gap",
        "*/15 1-3 * * *",
        "America/New_York",
        "2026-03-08T06:40:00Z",
        ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"],
    ),
    (
        "us_fall_hourly_once_in_repeated_hour",
        "0 * * * *",
        "America/New_York",
        "2026-11-01T04:30:00Z",
        ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"],
    ),
    (
        "us_fall_every_15_once",
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T05:40:00Z",
        ["2026-11-01T05:45:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:15:00Z"],
    ),
    (
        "us_fall_start_inside_second_pass",
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        ["2026-11-01T07:00:00Z", "2026-11-01T07:15:00Z"],
    ),
    (
        "us_fall_start_exactly_on_fire",
        "30 1 * * *",
        "America/Chicago",
        "2026-11-01T06:30:00Z",
        ["2026-11-02T07:30:00Z"],
    ),
    (
        "us_fall_daily_0130_once",
        "30 1 * * *",
        "America/Chicago",
        "2026-10-31T12:00:00Z",
        ["2026-11-01T06:30:00Z", "2026-11-02T07:30:00Z"],
    ),
    (
        "daily_0900_is_wall_time_not_24h",
        "0 9 * * *",
        "America/New_York",
        "2026-10-31T00:00:00Z",
        ["2026-10-31T13:00:00Z", "2026-11-01T14:00:00Z", "2026-11-02T14:00:00Z"],
    ),
    # --- EU forms: all at 01:00 UTC; local 01->02 (London), 02->03 (Berlin), 03->04 --
    (
        "eu_london_spring_0130_skipped",
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T00:00:00Z",
        ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"],
    ),
    (
        "eu_london_fall_0130_once",
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00:00Z",
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
    ),
    (
        "eu_berlin_spring_0200_skipped",
        "0 2 * * *",
        "Europe/Berlin",
        "2026-03-28T00:00:00Z",
        ["2026-03-28T01:00:00Z", "2026-03-30T00:00:00Z"],
    ),
    (
        "eu_berlin_fall_half_hours_once",
        "*/30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T00:00:00Z",
        ["2026-10-25T00:30:00Z", "2026-10-26T01:00:00Z"],
    ),
    (
        "eu_helsinki_spring_0300_skipped",
        "0 3 * * *",
        "Europe/Helsinki",
        "2026-03-28T00:00:00Z",
        ["2026-03-28T01:00:00Z", "2026-03-30T00:00:00Z"],
    ),
    # --- negative DST: Irish Standard Time is the summer 'standard' in tzdb ------------
    (
        "dublin_negative_dst_fall_once",
        "30 1 * * *",
        "Europe/Dublin",
        "2026-10-24T12:00:00Z",
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
    ),
    (
        "dublin_negative_dst_spring_skipped",
        "30 1 * * *",
        "Europe/Dublin",
        "2026-03-28T00:00:00Z",
        ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"],
    ),
    # --- 30-minute DST ------------------------------------------------------------------
    (
        "lord_howe_fall_half_hour_repeat",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T00:00:00Z",
        ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    ),
    (
        "lord_howe_spring_half_hour_gap",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T00:00:00Z",
        ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"],
    ),
    (
        "lord_howe_spring_quarter_hours",
        "*/15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00:00Z",
        ["2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"],
    ),
    # --- a whole calendar day that does not exist ---------------------------------------
    (
        "apia_2011_12_30_skipped_day",
        "0 12 * * *",
        "Pacific/Apia",
        "2011-12-28T00:00:00Z",
        ["2011-12-28T22:00:00Z", "2011-12-29T22:00:00Z", "2011-12-30T22:00:00Z"],
    ),
    (
        "apia_date_only_on_skipped_day",
        "0 12 30 12 *",
        "Pacific/Apia",
        "2011-12-01T00:00:00Z",
        ["2012-12-29T22:00:00Z"],
    ),
    # --- midnight gaps and evening repeats ------------------------------------------------
    (
        "sao_paulo_midnight_gap",
        "0 0 * * *",
        "America/Sao_Paulo",
        "2018-11-02T12:00:00Z",
        ["2018-11-03T03:00:00Z", "2018-11-05T02:00:00Z"],
    ),
    (
        "sao_paulo_evening_repeat",
        "30 23 * * *",
        "America/Sao_Paulo",
        "2019-02-15T12:00:00Z",
        ["2019-02-16T01:30:00Z", "2019-02-17T01:30:00Z", "2019-02-18T02:30:00Z"],
    ),
    (
        "santiago_midnight_gap",
        "0 0 * * *",
        "America/Santiago",
        "2026-09-04T12:00:00Z",
        ["2026-09-05T04:00:00Z", "2026-09-07T03:00:00Z"],
    ),
    (
        "santiago_evening_repeat",
        "30 23 * * *",
        "America/Santiago",
        "2026-04-03T12:00:00Z",
        ["2026-04-04T02:30:00Z", "2026-04-05T02:30:00Z", "2026-04-06T03:30:00Z"],
    ),
    (
        "havana_midnight_gap",
        "0 0 * * *",
        "America/Havana",
        "2026-03-06T12:00:00Z",
        ["2026-03-07T05:00:00Z", "2026-03-09T04:00:00Z"],
    ),
    # --- odd offsets --------------------------------------------------------------------
    (
        "kathmandu_plus_0545",
        "0 9 * * *",
        "Asia/Kathmandu",
        "2026-01-01T00:00:00Z",
        ["2026-01-01T03:15:00Z", "2026-01-02T03:15:00Z"],
    ),
    (
        "monrovia_1971_offset_with_seconds",
        "0 0 * * *",
        "Africa/Monrovia",
        "1971-06-01T00:00:00Z",
        ["1971-06-01T00:44:30Z", "1971-06-02T00:44:30Z"],
    ),
    (
        "kolkata_monthly_macro",
        "@monthly",
        "Asia/Kolkata",
        "2026-01-15T00:00:00Z",
        ["2026-01-31T18:30:00Z", "2026-02-28T18:30:00Z"],
    ),
    # --- calendar rules -----------------------------------------------------------------
    (
        "dom_dow_both_restricted_is_or",
        "0 0 13 * 5",
        "UTC",
        "2026-02-01T00:00:00Z",
        ["2026-02-06T00:00:00Z", "2026-02-13T00:00:00Z", "2026-02-20T00:00:00Z"],
    ),
    (
        "dom_star_step_is_unrestricted_so_and",
        "0 0 */7 * 5",
        "UTC",
        "2026-01-01T00:00:00Z",
        ["2026-05-01T00:00:00Z"],
    ),
    (
        "dow_7_is_sunday",
        "0 0 * * 7",
        "UTC",
        "2026-01-01T00:00:00Z",
        ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"],
    ),
    (
        "names_months_and_days",
        "0 12 * JAN-mar Mon-Fri",
        "UTC",
        "2026-03-31T00:00:00Z",
        ["2026-03-31T12:00:00Z", "2027-01-01T12:00:00Z"],
    ),
    (
        "weekly_macro_local_midnight",
        "@weekly",
        "Europe/Berlin",
        "2026-01-01T00:00:00Z",
        ["2026-01-03T23:00:00Z"],
    ),
    (
        "leap_day_only",
        "0 0 29 2 *",
        "UTC",
        "2026-01-01T00:00:00Z",
        ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"],
    ),
    (
        "yearly_new_year_sydney",
        "@yearly",
        "Australia/Sydney",
        "2026-06-01T00:00:00Z",
        ["2026-12-31T13:00:00Z"],
    ),
]


@pytest.mark.parametrize(
    ("expr", "zone", "after", "expected"),
    [pytest.param(*v[1:], id=v[0]) for v in VECTORS],
)
def test_cron_next_fires_named_vectors(expr: str, zone: str, after: str, expected: list[str]):
    # GIVEN a schedule and a start; WHEN asking for its next fires one after another
    fires = _next(expr, zone, after, len(expected))
    # THEN each is the instant the contract promises
    assert fires == expected


@pytest.mark.parametrize(
    ("expr", "zone", "after", "expected"),
    [pytest.param(*v[1:], id=v[0]) for v in VECTORS],
)
def test_cron_window_equals_successive_next(expr: str, zone: str, after: str, expected):
    # GIVEN the same vectors; WHEN the planner asks for the whole window at once
    rule = CronRule(parse_cron(expr), get_zone(zone))
    fires = rule.fires(_epoch(after), _epoch(expected[-1]))
    # THEN it returns exactly the same instants
    assert [utc_text(f) for f in fires] == expected


@pytest.mark.parametrize(
    ("expr", "zone", "after", "count", "note_parts"),
    [
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            2,
            ["2026-03-08", "02:30", "does not exist"],
            id="gap_note",
        ),
        pytest.param(
            "*/15 * * * *",
            "America/New_York",
            "2026-11-01T05:00:00Z",
            6,
            ["2026-11-01", "01:15, 01:30, 01:45", "twice", "once"],
            id="repeat_note",
        ),
        pytest.param(
            "0 12 * * *",
            "Pacific/Apia",
            "2011-12-29T00:00:00Z",
            2,
            ["2011-12-30", "12:00", "does not exist"],
            id="skipped_day_note",
        ),
    ],
)
def test_preview_names_dst_affected_dates(expr, zone, after, count, note_parts):
    # GIVEN a preview across a transition; WHEN it is computed
    rule = CronRule(parse_cron(expr), get_zone(zone))
    result = preview(rule, _epoch(after), count, get_zone(zone))
    # THEN exactly one note names the affected date and what happened
    assert len(result.notes) == 1
    for part in note_parts:
        assert part in result.notes[0]


def test_preview_without_transition_has_no_notes():
    rule = CronRule(parse_cron("0 9 * * *"), get_zone("Europe/Berlin"))
    result = preview(rule, _epoch("2026-06-01T00:00:00Z"), 5, get_zone("Europe/Berlin"))
    assert len(result.fires) == 5
    assert result.notes == []

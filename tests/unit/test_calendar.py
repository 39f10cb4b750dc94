"""The calendar the time engine computes in (0002-01-01 to 9998-12-31, UTC): every instant
in it shows in every zone, instants outside are refused, and no rule fires past its end."""

from __future__ import annotations

import pytest

from punctual.timing import (
    MAX_INSTANT,
    MIN_INSTANT,
    Bounds,
    CronRule,
    OneShotRule,
    RateRule,
    get_zone,
    in_calendar,
    local_text,
    parse_cron,
    preview,
    utc_text,
)
from punctual.timing.zones import zone_names
from tests.instants import epoch

DAY = 86400


def test_calendar_edges_show_in_every_zone():
    # GIVEN the first and last instant of the calendar
    # THEN every zone of the tz database shows both (no year 0 or 10000 anywhere)
    for name in sorted(zone_names()):
        zone = get_zone(name)
        assert local_text(MIN_INSTANT, zone)[:4] in {"0001", "0002"}, name
        assert local_text(MAX_INSTANT, zone)[:4] in {"9998", "9999"}, name
    assert (utc_text(MIN_INSTANT), utc_text(MAX_INSTANT)) == (
        "0002-01-01T00:00:00Z",
        "9998-12-31T23:59:59Z",
    )


def test_in_calendar_refuses_one_second_outside():
    assert in_calendar(MIN_INSTANT) == MIN_INSTANT
    assert in_calendar(MAX_INSTANT) == MAX_INSTANT
    for outside in (MIN_INSTANT - 1, MAX_INSTANT + 1):
        with pytest.raises(ValueError, match="must lie between 0002-01-01T00:00:00Z"):
            in_calendar(outside)


def test_no_rule_fires_past_the_end_of_the_calendar():
    # GIVEN a daily rate anchored at the calendar's last midnight (its next fire would be
    # 9999-01-01: year 10000 somewhere east, which crashed every read of the schedule)
    last_midnight = MAX_INSTANT - DAY + 1
    rate = RateRule(DAY, last_midnight)
    # THEN it fires at the anchor and never after
    assert rate.next_after(last_midnight - 1) == last_midnight
    assert rate.next_after(last_midnight) is None
    assert rate.fires(last_midnight - DAY, MAX_INSTANT + 10 * DAY) == (last_midnight,)
    # AND a cron and a one-shot stop there too
    cron = CronRule(parse_cron("0 0 * * *"), get_zone("UTC"))
    assert cron.next_after(last_midnight - 1) == last_midnight
    assert cron.next_after(last_midnight) is None
    assert cron.fires(last_midnight - 1, MAX_INSTANT + 3 * DAY) == (last_midnight,)
    assert OneShotRule(MAX_INSTANT, Bounds()).next_after(MAX_INSTANT - 1) == MAX_INSTANT


def test_preview_runs_from_the_first_instant_in_a_zone_ahead_of_utc():
    # GIVEN the calendar's first instant and a zone 14 hours ahead (OverflowError before)
    rule = CronRule(parse_cron("0 0 * * *"), get_zone("Pacific/Kiritimati"))
    # WHEN previewed; THEN local midnights follow, in the zone's rules of the time
    fires = preview(rule, MIN_INSTANT, 2, rule.zone).fires
    assert [f.local for f in fires] == [
        "0002-01-01T00:00:00-10:29:20",
        "0002-01-02T00:00:00-10:29:20",
    ]


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2026-03-04T12:00:00Z", "2026-03-09T00:00:00Z"),  # walked to: none left that day
        ("2026-03-08T23:00:00Z", "2026-03-09T00:00:00Z"),  # the day's window holds it
        ("2026-03-09T00:00:00Z", None),  # the next one is past end_at
    ],
)
def test_a_cron_fires_at_its_end_at_and_not_after_from_any_start(
    after: str, expected: str | None
) -> None:
    # GIVEN Mondays at midnight UTC, ending exactly at one (end_at is inclusive)
    end = epoch("2026-03-09T00:00:00Z")
    rule = CronRule(parse_cron("0 0 * * 1"), get_zone("UTC"), Bounds(end=end))
    # THEN the last fire is end_at itself, found by the walk or by the day's window, and
    # nothing after it
    assert rule.next_after(epoch(after)) == (None if expected is None else epoch(expected))

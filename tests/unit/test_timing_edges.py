"""The time engine at its edges, each found by `make mutate` (a bug no other test caught):
the error messages users read, a wall time with seconds, a rule's start and end bounds
taken exactly, the calendar's last year, and instants as aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path

import pytest

from punctual.timing import (
    Bounds,
    CronError,
    CronRule,
    get_zone,
    parse_cron,
    resolve_at,
    tzdata_version,
)
from punctual.timing.zones import ZoneSource, from_epoch, to_epoch, use_zone_source

BERLIN = get_zone("Europe/Berlin")


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("  ", "expression is empty"),
        (
            "@often",
            "unknown macro '@often'; known macros: "
            "@annually @daily @hourly @midnight @monthly @weekly @yearly",
        ),
        ("x-5 * * * *", "minute field: 'x' in 'x-5' is not a number or a known name"),
        ("1-x * * * *", "minute field: 'x' in '1-x' is not a number or a known name"),
        ("1-61 * * * *", "minute field: 61 in '1-61' is outside 0-59"),
        ("5-4 * * * *", "minute field: range '5-4' runs backwards"),
    ],
)
def test_cron_errors_name_the_field_and_the_item(expression, message):
    with pytest.raises(CronError) as error:
        parse_cron(expression)
    assert str(error.value) == message


def test_cron_range_of_one_value_is_that_value():
    assert sorted(parse_cron("5-5 * * * *").minutes) == [5]


def test_resolve_at_keeps_the_seconds_of_a_local_time():
    # 09:00:30 in Berlin in summer (UTC+2) is 07:00:30Z
    assert resolve_at("2026-06-01T09:00:30", "Europe/Berlin").instant == _epoch(
        "2026-06-01T07:00:30Z"
    )


def test_resolve_at_refuses_a_local_time_that_does_not_exist_saying_why():
    with pytest.raises(ValueError, match="does not exist") as error:
        resolve_at("2026-03-29T02:30:00", "Europe/Berlin")
    assert str(error.value) == (
        "2026-03-29T02:30:00 does not exist in Europe/Berlin (the clocks skip it at a "
        "daylight-saving or zone change); pick another time"
    )


@pytest.mark.parametrize("before_start", [1, 2])
def test_cron_fires_leave_out_those_before_the_rules_start(before_start):
    # GIVEN an hourly rule starting at 10:00Z, asked from `before_start` hours before it to
    # well after its fires in the window
    start = _epoch("2026-06-01T10:00:00Z")
    rule = CronRule(parse_cron("0 * * * *"), get_zone("UTC"), Bounds(start=start))
    fires = rule.fires(start - before_start * 3600 - 1, start + 2 * 3600)
    # THEN only those at or after the start
    assert fires == (start, start + 3600, start + 7200)


def test_cron_next_after_returns_a_fire_exactly_at_the_rules_end():
    end = _epoch("2026-06-01T10:00:00Z")
    rule = CronRule(parse_cron("0 * * * *"), get_zone("UTC"), Bounds(end=end))
    assert rule.next_after(end - 1) == end
    assert rule.next_after(end) is None


def test_cron_walks_into_the_calendars_last_year():
    # GIVEN a yearly fire, asked from the year before the calendar's last (9998)
    rule = CronRule(parse_cron("0 0 1 6 *"), get_zone("UTC"))
    # THEN the fire of 9998 is found, and none after it
    last = int(datetime(9998, 6, 1, tzinfo=UTC).timestamp())
    assert rule.next_after(int(datetime(9997, 7, 1, tzinfo=UTC).timestamp())) == last
    assert rule.next_after(last) is None


def test_from_epoch_is_an_aware_utc_datetime():
    moment = from_epoch(_epoch("2026-06-01T07:00:30Z"))
    assert moment.tzinfo is UTC
    assert moment == datetime(2026, 6, 1, 7, 0, 30, tzinfo=UTC)


class _NoOffset(tzinfo):
    """A tzinfo that does not know its offset: the datetime is naive in effect."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


@pytest.mark.parametrize("moment", [datetime(2026, 6, 1), datetime(2026, 6, 1, tzinfo=_NoOffset())])
def test_to_epoch_refuses_a_datetime_without_an_offset(moment):
    with pytest.raises(ValueError, match="naive") as error:
        to_epoch(moment)
    assert str(error.value) == "a naive datetime has no instant; give an offset or a zone"


def test_to_epoch_floors_a_fraction_of_a_second_before_1970():
    # half a second before the epoch is in second -1, not 0
    assert to_epoch(datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC)) == -1


def test_use_zone_source_switches_the_rules_and_back():
    pinned = tzdata_version()
    use_zone_source(ZoneSource("2025b", Path(__file__).parent.parent / "tzdata_2025b"))
    try:
        assert tzdata_version() == "2025b"
        assert get_zone("Europe/Berlin").key == "Europe/Berlin"
    finally:
        use_zone_source(None)
    assert tzdata_version() == pinned

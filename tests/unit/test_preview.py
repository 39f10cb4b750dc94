"""Preview (punctual.timing.preview): the next fires of every rule kind, in UTC and local
time, and the notes a user reads about DST, word for word (the API and the CLI show them).

Europe/Berlin springs forward at 01:00 UTC on 2026-03-29 (02:00-02:59 local does not
exist) and falls back at 01:00 UTC on 2026-10-25 (02:00-02:59 local occurs twice)."""

from __future__ import annotations

from datetime import datetime

import pytest

from punctual.timing import Bounds, CronRule, OneShotRule, RateRule, get_zone, parse_cron
from punctual.timing.preview import MAX_PREVIEW, Fire, preview

BERLIN = get_zone("Europe/Berlin")


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _cron(expression: str, bounds: Bounds | None = None) -> CronRule:
    return CronRule(parse_cron(expression), BERLIN, bounds or Bounds())


def test_preview_of_a_rate_keeps_its_interval_across_a_dst_change_and_says_so():
    # GIVEN every 12 hours from 06:00Z on the day before Berlin springs forward
    anchor = _epoch("2026-03-28T06:00:00Z")
    rule = RateRule(12 * 3600, anchor)
    # WHEN previewed from just before its anchor
    result = preview(rule, anchor - 1, 4, BERLIN)
    # THEN four fires, 12 hours apart, each in UTC and Berlin's wall time of the moment
    assert result.fires == [
        Fire(anchor, "2026-03-28T06:00:00Z", "2026-03-28T07:00:00+01:00"),
        Fire(anchor + 43_200, "2026-03-28T18:00:00Z", "2026-03-28T19:00:00+01:00"),
        Fire(anchor + 86_400, "2026-03-29T06:00:00Z", "2026-03-29T08:00:00+02:00"),
        Fire(anchor + 129_600, "2026-03-29T18:00:00Z", "2026-03-29T20:00:00+02:00"),
    ]
    # AND one note, on the day the offset changes before a fire
    assert result.notes == [
        "2026-03-29: the UTC offset of Europe/Berlin changes before this fire; "
        "elapsed-time rules keep their interval, so the local time shifts"
    ]
    assert result.as_json() == {
        "fires": [{"utc": f.utc, "local": f.local} for f in result.fires],
        "notes": result.notes,
    }


def test_preview_of_a_one_shot_shows_its_only_fire_then_stops():
    at = _epoch("2026-06-01T12:00:00Z")
    result = preview(OneShotRule(at), at - 60, 5, BERLIN)
    assert result.fires == [Fire(at, "2026-06-01T12:00:00Z", "2026-06-01T14:00:00+02:00")]
    assert result.notes == []
    # AND after it, nothing
    assert preview(OneShotRule(at), at, 5, BERLIN).fires == []


@pytest.mark.parametrize("count", [1, MAX_PREVIEW])
def test_preview_takes_one_to_a_thousand_fires(count):
    rule = RateRule(60, _epoch("2026-06-01T00:00:00Z"))
    assert len(preview(rule, 0, count, BERLIN).fires) == count
    assert len(preview(_cron("* * * * *"), 0, count, BERLIN).fires) == count


@pytest.mark.parametrize("count", [0, MAX_PREVIEW + 1])
def test_preview_refuses_a_count_out_of_range(count):
    with pytest.raises(ValueError, match=f"count must be between 1 and {MAX_PREVIEW}"):
        preview(RateRule(60, 0), 0, count, BERLIN)


def test_preview_of_a_cron_stops_at_its_end_including_a_fire_at_the_end():
    # GIVEN a daily 09:00 rule whose end is its third fire's instant
    start = _epoch("2026-06-01T00:00:00Z")
    end = _epoch("2026-06-03T07:00:00Z")  # 09:00 in Berlin
    result = preview(_cron("0 9 * * *", Bounds(end=end)), start, 10, BERLIN)
    # THEN three fires, the last at the end (inclusive)
    assert [f.instant for f in result.fires] == [end - 2 * 86_400, end - 86_400, end]
    assert result.fires[-1] == Fire(end, "2026-06-03T07:00:00Z", "2026-06-03T09:00:00+02:00")


@pytest.mark.parametrize(
    ("expression", "walls"),
    [
        ("30 2 * * *", "02:30 does"),
        ("*/15 2 * * *", "02:00, 02:15, 02:30, 02:45 do"),
        ("*/12 2 * * *", "5 wall times from 02:00 to 02:48 do"),
        ("*/10 2 * * *", "6 wall times from 02:00 to 02:50 do"),
    ],
)
def test_preview_of_a_cron_names_the_wall_times_a_spring_forward_skips(expression, walls):
    result = preview(_cron(expression), _epoch("2026-03-29T00:00:00Z"), 2, BERLIN)
    assert result.notes == [
        f"2026-03-29: {walls} not exist in Europe/Berlin (the clocks skip ahead); skipped"
    ]


@pytest.mark.parametrize(
    ("expression", "walls", "repeated"),
    [
        ("30 2 * * *", "02:30 occurs", ["02:30"]),
        ("0,30 2 * * *", "02:00, 02:30 occur", ["02:00", "02:30"]),
    ],
)
def test_preview_of_a_cron_names_the_wall_times_a_fall_back_repeats(expression, walls, repeated):
    # GIVEN from 01:00 local (CEST) on the day Berlin falls back
    result = preview(_cron(expression), _epoch("2026-10-24T23:00:00Z"), 3, BERLIN)
    assert result.notes == [
        f"2026-10-25: {walls} twice in Europe/Berlin (the clocks fall back); "
        "fired once, at the earlier instant"
    ]
    # AND each repeated wall time fires once, at its earlier instant (CEST, +02:00)
    assert [f.local for f in result.fires][: len(repeated)] == [
        f"2026-10-25T{wall}:00+02:00" for wall in repeated
    ]


def test_preview_dates_an_offset_change_by_the_zones_calendar_not_utcs():
    # GIVEN every 12 hours in Auckland, over the night its summer time ends (03:00 NZDT on
    # 2026-04-05 = 14:00Z on 2026-04-04)
    auckland = get_zone("Pacific/Auckland")
    anchor = _epoch("2026-04-04T06:00:00Z")  # 19:00 NZDT on the 4th
    result = preview(RateRule(12 * 3600, anchor), anchor - 1, 2, auckland)
    # THEN the second fire (18:00Z on the 4th) is 06:00 NZST on the 5th: the note's date
    assert result.fires[1].local == "2026-04-05T06:00:00+12:00"
    assert result.notes == [
        "2026-04-05: the UTC offset of Pacific/Auckland changes before this fire; "
        "elapsed-time rules keep their interval, so the local time shifts"
    ]


def test_preview_from_after_a_spring_forward_notes_no_skip_before_it():
    # GIVEN daily 02:30 in Berlin, previewed from 05:00 local on the day 02:30 did not exist
    result = preview(_cron("30 2 * * *"), _epoch("2026-03-29T03:00:00Z"), 1, BERLIN)
    # THEN the next fire is the next day's, and the gap before the preview's start is no note
    assert [f.local for f in result.fires] == ["2026-03-30T02:30:00+02:00"]
    assert result.notes == []

"""Admission control's arithmetic: the strict fires a schedule can add to each UTC minute of
the hour (tenancy.strict_minute_load), which the tenant's max_strict_fires_per_minute
bounds. Too little is a quota bypassed; too much refuses schedules that fit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from punctual.domain.schedule import ScheduleDefinition
from punctual.domain.tenancy import strict_minute_load

CREATED = datetime(2026, 4, 10, 12, 0, tzinfo=UTC)


def load(spec: dict[str, Any], created_at: datetime = CREATED, **fields: Any) -> dict[int, int]:
    definition = ScheduleDefinition.model_validate({"target": "default", "spec": spec, **fields})
    return strict_minute_load(definition, created_at)


def cron(expression: str, timezone: str = "UTC", **extra: Any) -> dict[str, Any]:
    return {"kind": "cron", "expression": expression, "timezone": timezone, **extra}


def rate(expression: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "rate", "expression": expression, **extra}


ALL_MINUTES = dict.fromkeys(range(60), 1)


@pytest.mark.parametrize(
    ("spec", "minutes"),
    [
        pytest.param(cron("5,35 * * * *"), {5, 35}, id="utc-cron"),
        # a whole-hour offset, DST or not, moves no minute
        pytest.param(cron("0 * * * *", "America/New_York"), {0}, id="new-york"),
        # UTC+5:30: a local :00 is a UTC :30
        pytest.param(cron("0 * * * *", "Asia/Kolkata"), {30}, id="kolkata"),
        # UTC+5:45
        pytest.param(cron("10 * * * *", "Asia/Kathmandu"), {25}, id="kathmandu"),
        # UTC+10:30, +11:00 in its DST (from October): both within the coming year
        pytest.param(cron("0 * * * *", "Australia/Lord_Howe"), {0, 30}, id="lord-howe"),
        pytest.param(cron("*/20 * * * *", "Australia/Lord_Howe"), {0, 10, 20, 30, 40, 50}),
    ],
)
def test_a_cron_loads_its_minutes_in_utc_under_every_offset_of_the_coming_year(
    spec: dict[str, Any], minutes: set[int]
):
    assert load(spec) == dict.fromkeys(minutes, 1)


def test_only_the_offsets_of_the_coming_year_count():
    # GIVEN Asia/Pyongyang, on +8:30 from 2015-08-15 to 2018-05-04, +9:00 around it
    hourly = cron("0 * * * *", "Asia/Pyongyang")
    # THEN a schedule made two weeks before the change to +8:30 loads both minutes ...
    assert load(hourly, datetime(2015, 8, 1, tzinfo=UTC)) == {0: 1, 30: 1}
    # ... and one made a month after the change back loads the present one only
    assert load(hourly, datetime(2018, 6, 1, tzinfo=UTC)) == {0: 1}


@pytest.mark.parametrize(
    ("spec", "minutes"),
    [
        # 20 minutes from :05 (its anchor): three minutes each hour
        pytest.param(rate("rate(20 minutes)", anchor="2026-04-10T00:05:00Z"), {5, 25, 45}),
        # 90 minutes from 00:10: hours alternate between :10 and :40
        pytest.param(rate("rate(90 minutes)", anchor="2026-04-10T00:10:00Z"), {10, 40}),
        # 2 hours: the same minute every time
        pytest.param(rate("rate(2 hours)", anchor="2026-04-10T00:17:00Z"), {17}),
        # anchored at start_at when it has no anchor
        pytest.param(rate("rate(30 minutes)", start_at="2026-05-01T00:12:00Z"), {12, 42}),
        # anchored at its creation otherwise (12:00 here)
        pytest.param(rate("rate(15 minutes)"), {0, 15, 30, 45}),
    ],
)
def test_a_rate_loads_the_minutes_its_instants_fall_in(spec: dict[str, Any], minutes: set[int]):
    assert load(spec) == dict.fromkeys(minutes, 1)


def test_a_rate_that_cycles_through_every_minute_loads_them_all():
    # GIVEN 7 minutes, coprime with 60: its instants fall in every minute of the hour in turn
    assert load(rate("rate(7 minutes)", anchor="2026-04-10T00:00:00Z")) == ALL_MINUTES
    # ... as does 3601 minutes (an hour's worth of minutes plus one: each instant a minute
    # later in the hour than the one before), while 3 minutes from :01:30 keeps to every
    # third minute
    assert load(rate("rate(3601 minutes)", anchor="2026-04-10T00:00:00Z")) == ALL_MINUTES
    assert load(rate("rate(3 minutes)", anchor="2026-04-10T00:01:30Z")) == dict.fromkeys(
        range(1, 60, 3), 1
    )


def test_a_one_shot_loads_the_minute_of_its_instant():
    assert load({"kind": "at", "at": "2026-06-01T10:17:30Z"}) == {17: 1}
    # read in its zone: 10:17 in Kolkata is 04:47 UTC
    assert load({"kind": "at", "at": "2026-06-01T10:17:00", "timezone": "Asia/Kolkata"}) == {47: 1}


def test_a_flexible_schedule_loads_no_minute():
    assert load(cron("0 * * * *"), flexible_window_seconds=300) == {}
    assert load(rate("rate(7 minutes)"), flexible_window_seconds=60) == {}


@pytest.mark.parametrize(
    ("spec", "minutes"),
    [
        # America/St_Johns (UTC-3:30, -2:30 in summer) springs forward at 02:00 local, 05:30Z:
        # a skipped 02:15 fires there, at minute 30, beside its usual :45 and :45
        pytest.param(
            cron("15 2 * * *", "America/St_Johns", dst={"gap": "SHIFT"}), {45, 30}, id="st-johns"
        ),
        # Lord Howe jumps from +10:30 to +11 at 02:00 local, 15:30Z: minute 30
        pytest.param(
            cron("10 2 * * *", "Australia/Lord_Howe", dst={"gap": "SHIFT"}),
            {40, 10, 30},
            id="lord-howe",
        ),
        # SKIP adds nothing, nor does a zone whose clocks never jump
        pytest.param(cron("15 2 * * *", "America/St_Johns"), {45}, id="skip"),
        pytest.param(cron("15 2 * * *", "Asia/Kolkata", dst={"gap": "SHIFT"}), {45}, id="none"),
        # Vancouver keeps UTC-7 all year from November 2026 (tzdata 2026f): its last jump
        # (2026-03-08, 10:00Z) lies before a schedule made in December, so none counts
        pytest.param(
            cron("15 2 * * *", "America/Vancouver", dst={"gap": "SHIFT"}),
            {15},
            id="jumps-behind",
        ),
    ],
)
def test_a_shifted_gap_loads_the_minute_of_its_zones_jumps(spec: dict[str, Any], minutes: set[int]):
    found = load(spec, datetime(2026, 12, 1, tzinfo=UTC))
    assert found == dict.fromkeys(minutes, 1)
    assert all(type(minute) is int for minute in found)  # (the tenant's load is indexed by it)


def test_a_one_shot_fired_at_both_loads_both_instants_minutes():
    # GIVEN Lord Howe's repeated half hour (01:30-02:00 local, first at +11, then at +10:30):
    # 01:40 is 14:40Z and 15:10Z on 2026-04-05
    at = {"kind": "at", "at": "2026-04-05T01:40:00", "timezone": "Australia/Lord_Howe"}
    assert load(at) == {40: 1}
    assert load(at | {"dst": {"repeat": "LAST"}}) == {10: 1}
    assert load(at | {"dst": {"repeat": "BOTH"}}) == {40: 1, 10: 1}

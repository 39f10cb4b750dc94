"""The DST choice per schedule (docs/time.md, *Daylight saving: the choice per schedule*):
named vectors worked out by hand from the zone rules, and the one-shot's resolution against
the brute-force oracle in every zone.

America/New_York 2026: the clocks skip 02:00-03:00 EST on 2026-03-08 (the gap ends at
07:00Z) and repeat 01:00-02:00 on 2026-11-01 (01:30 EDT = 05:30Z, 01:30 EST = 06:30Z).
"""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from punctual.domain.specs import ScheduleSpec
from punctual.timing import (
    CronRule,
    DstPolicy,
    Gap,
    NoSuchWallTime,
    Repeat,
    get_zone,
    local_wall,
    parse_cron,
    preview,
    resolve_at,
    utc_text,
)
from tests.unit.cron_oracle import choose, jump_instant, transitions
from tests.unit.test_cron_property import ALL_ZONES, HIGH, LOW, SETTINGS

SPEC: TypeAdapter[object] = TypeAdapter(ScheduleSpec)


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _fires(expr: str, zone: str, dst: DstPolicy, after: str, until: str) -> list[str]:
    rule = CronRule(parse_cron(expr), get_zone(zone), dst=dst)
    return [utc_text(i) for i in rule.fires(_epoch(after), _epoch(until))]


GAP_DAY = ("2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z")
REPEAT_DAY = ("2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z")


@pytest.mark.parametrize(
    ("name", "expr", "zone", "dst", "window", "expected"),
    [
        ("gap_skip_daily", "30 2 * * *", "America/New_York", DstPolicy(), GAP_DAY, []),
        (
            "gap_shift_daily_to_the_gap_end",
            "30 2 * * *",
            "America/New_York",
            DstPolicy(Gap.SHIFT),
            GAP_DAY,
            ["2026-03-08T07:00:00Z"],
        ),
        (
            "gap_shift_every_15_collapses_with_0300",
            "*/15 2-3 * * *",
            "America/New_York",
            DstPolicy(Gap.SHIFT),
            GAP_DAY,
            # 02:00..02:45 do not exist: fired once at 03:00 EDT, which also matches itself
            [
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:15:00Z",
                "2026-03-08T07:30:00Z",
                "2026-03-08T07:45:00Z",
            ],
        ),
        (
            "gap_shift_lord_howe_half_hour",
            # Lord Howe skips 02:00-02:30 (+10:30 -> +11) on 2026-10-04: 02:00 local = 15:30Z
            "15 2 * * *",
            "Australia/Lord_Howe",
            DstPolicy(Gap.SHIFT),
            ("2026-10-03T12:00:00Z", "2026-10-04T12:00:00Z"),
            ["2026-10-03T15:30:00Z"],
        ),
        (
            "gap_shift_apia_skipped_day_to_its_end",
            # Samoa skipped 2011-12-30 entirely: 2011-12-31T00:00+14:00 = 2011-12-30T10:00Z
            "0 12 * * *",
            "Pacific/Apia",
            DstPolicy(Gap.SHIFT),
            ("2011-12-29T00:00:00Z", "2011-12-31T00:00:00Z"),
            ["2011-12-29T22:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"],
        ),
        (
            "repeat_first_daily",
            "30 1 * * *",
            "America/New_York",
            DstPolicy(),
            REPEAT_DAY,
            ["2026-11-01T05:30:00Z"],
        ),
        (
            "repeat_last_daily",
            "30 1 * * *",
            "America/New_York",
            DstPolicy(repeat=Repeat.LAST),
            REPEAT_DAY,
            ["2026-11-01T06:30:00Z"],
        ),
        (
            "repeat_both_daily",
            "30 1 * * *",
            "America/New_York",
            DstPolicy(repeat=Repeat.BOTH),
            REPEAT_DAY,
            ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"],
        ),
        (
            "repeat_both_hourly_in_time_order",
            "0,30 0-2 * * *",
            "America/New_York",
            DstPolicy(repeat=Repeat.BOTH),
            ("2026-11-01T04:00:00Z", "2026-11-01T07:30:00Z"),
            [
                "2026-11-01T04:30:00Z",
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T07:00:00Z",
                "2026-11-01T07:30:00Z",
            ],
        ),
        (
            "repeat_last_dublin_negative_dst",
            # Europe/Dublin's winter time is the negative offset: 01:00-02:00 repeats on
            # 2026-10-25 (01:30 IST = 00:30Z, 01:30 GMT = 01:30Z)
            "30 1 * * *",
            "Europe/Dublin",
            DstPolicy(repeat=Repeat.LAST),
            ("2026-10-25T00:00:00Z", "2026-10-26T00:00:00Z"),
            ["2026-10-25T01:30:00Z"],
        ),
    ],
)
def test_dst_policy_named_vectors(name, expr, zone, dst, window, expected):
    # GIVEN a cron, a zone and a DST choice; WHEN a window around a transition is planned
    # THEN it fires where the choice says (worked out by hand)
    assert _fires(expr, zone, dst, *window) == expected


def test_a_repeated_wall_time_fired_at_both_walks_fire_by_fire_from_inside_the_first_pass():
    # GIVEN an every-20-minutes cron fired at BOTH, walked from 01:50 EDT (05:50Z), in the
    # first pass of the repeated hour (its second pass's 01:00, 01:20, 01:40 are later)
    rule = CronRule(
        parse_cron("*/20 * * * *"), get_zone("America/New_York"), dst=DstPolicy(repeat=Repeat.BOTH)
    )
    walked: list[str] = []
    fire = rule.next_after(_epoch("2026-11-01T05:50:00Z"))
    while fire is not None and len(walked) < 4:
        walked.append(utc_text(fire))
        fire = rule.next_after(fire)
    # THEN the second pass's wall times are not lost behind the start's wall time
    assert walked == [
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:20:00Z",
        "2026-11-01T06:40:00Z",
        "2026-11-01T07:00:00Z",
    ]


@pytest.mark.parametrize(
    ("repeat", "expected"),
    [
        (Repeat.LAST, ["2026-11-01T06:00:00Z", "2026-11-01T06:20:00Z", "2026-11-01T06:40:00Z"]),
        (
            Repeat.BOTH,
            [
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:20:00Z",
                "2026-11-01T05:40:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:20:00Z",
                "2026-11-01T06:40:00Z",
            ],
        ),
    ],
)
@pytest.mark.parametrize("start", ["2026-11-01T05:50:00Z", "2026-11-01T05:00:00Z"])
def test_a_window_from_inside_the_first_pass_keeps_the_second_pass_fires(
    repeat: Repeat, expected: list[str], start: str
):
    # GIVEN an every-20-minutes cron fired LAST or at BOTH, planned in windows that start
    # inside the first pass of New York's repeated hour (01:50 EDT, 01:00 EDT), up to 07:00Z
    rule = CronRule(
        parse_cron("*/20 * * * *"), get_zone("America/New_York"), dst=DstPolicy(repeat=repeat)
    )
    fires = [utc_text(i) for i in rule.fires(_epoch(start), _epoch("2026-11-01T06:59:00Z"))]
    # THEN the second pass's 01:00, 01:20, 01:40 (EST) are there, though their wall times
    # lie before the start's
    assert fires == [f for f in expected if f > start]


@pytest.mark.parametrize(
    ("dst", "note_end"),
    [
        (DstPolicy(), "skipped"),
        (DstPolicy(Gap.SHIFT), "fired at the first instant after the gap"),
    ],
)
def test_preview_notes_say_what_the_gap_choice_does(dst, note_end):
    rule = CronRule(parse_cron("30 2 * * *"), get_zone("America/New_York"), dst=dst)
    result = preview(rule, _epoch("2026-03-07T12:00:00Z"), 1, get_zone("America/New_York"))
    assert result.notes == [
        "2026-03-08: 02:30 does not exist in America/New_York (the clocks skip ahead); " + note_end
    ]


@pytest.mark.parametrize(
    ("repeat", "note_end", "count"),
    [
        (Repeat.FIRST, "fired once, at the earlier instant", 1),
        (Repeat.LAST, "fired once, at the later instant", 1),
        (Repeat.BOTH, "fired at both instants", 2),
    ],
)
def test_preview_notes_say_what_the_repeat_choice_does(repeat, note_end, count):
    zone = get_zone("America/New_York")
    rule = CronRule(parse_cron("30 1 * * *"), zone, dst=DstPolicy(repeat=repeat))
    result = preview(rule, _epoch("2026-10-31T12:00:00Z"), 3, zone)
    assert result.notes == [
        "2026-11-01: 01:30 occurs twice in America/New_York (the clocks fall back); " + note_end
    ]
    assert sum(f.local.startswith("2026-11-01T01:30") for f in result.fires) == count


@pytest.mark.parametrize(
    ("at", "dst", "instants", "note_part"),
    [
        ("2026-03-08T02:30:00", DstPolicy(Gap.SHIFT), ["2026-03-08T07:00:00Z"], "shifted"),
        ("2026-11-01T01:30:00", DstPolicy(), ["2026-11-01T05:30:00Z"], "earlier instant"),
        ("2026-11-01T01:30:00", DstPolicy(repeat=Repeat.LAST), ["2026-11-01T06:30:00Z"], "later"),
        (
            "2026-11-01T01:30:00",
            DstPolicy(repeat=Repeat.BOTH),
            ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"],
            "both instants",
        ),
        ("2026-06-01T09:00:00", DstPolicy(Gap.SHIFT, Repeat.BOTH), ["2026-06-01T13:00:00Z"], None),
    ],
)
def test_a_one_shot_in_a_zone_follows_its_dst_choice(at, dst, instants, note_part):
    resolved = resolve_at(at, "America/New_York", dst)
    got = [resolved.instant] + ([resolved.second] if resolved.second is not None else [])
    assert [utc_text(i) for i in got] == instants
    if note_part is None:
        assert resolved.note is None
    else:
        assert note_part in (resolved.note or "")


def test_a_one_shot_in_a_gap_is_refused_with_skip_naming_shift():
    with pytest.raises(NoSuchWallTime, match="does not exist"):
        resolve_at("2026-03-08T02:30:00", "America/New_York", DstPolicy())
    with pytest.raises(ValidationError, match=r"set dst\.gap to SHIFT"):
        SPEC.validate_python(
            {"kind": "at", "at": "2026-03-08T02:30:00", "timezone": "America/New_York"}
        )


def test_a_one_shot_fired_at_both_has_two_fires_and_ends_after_the_second():
    spec = SPEC.validate_python(
        {
            "kind": "at",
            "at": "2026-11-01T01:30:00",
            "timezone": "America/New_York",
            "dst": {"repeat": "BOTH"},
        }
    )
    rule = spec.rule()  # type: ignore[attr-defined]
    first, second = _epoch("2026-11-01T05:30:00Z"), _epoch("2026-11-01T06:30:00Z")
    assert rule.fires(first - 1, second) == (first, second)
    assert rule.next_after(first) == second
    assert rule.next_after(second) is None


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        (
            {"kind": "rate", "expression": "rate(1 hour)", "dst": {"gap": "SHIFT"}},
            "dst",
            "elapsed time",
        ),
        (
            {"kind": "at", "at": "2026-03-08T07:00:00Z", "dst": {"gap": "SHIFT"}},
            "at",
            "names its offset",
        ),
        (
            {
                "kind": "at",
                "at": "2026-03-08T02:00:00-05:00",
                "timezone": "America/New_York",
                "dst": {"repeat": "BOTH"},
            },
            "at",
            "names its offset",
        ),
        (
            {"kind": "cron", "expression": "0 2 * * *", "timezone": "UTC", "dst": {"gap": "shift"}},
            "gap",
            "SKIP",
        ),
        (
            {"kind": "cron", "expression": "0 2 * * *", "timezone": "UTC", "dst": {"when": 1}},
            "when",
            "Extra inputs",
        ),
    ],
)
def test_a_dst_choice_where_none_applies_or_malformed_is_refused_naming_the_field(
    spec, field, reason
):
    with pytest.raises(ValidationError) as error:
        SPEC.validate_python(spec)
    (problem,) = error.value.errors()
    assert problem["loc"][-1] == field
    assert reason in problem["msg"]


@st.composite
def wall_near_a_transition(draw) -> tuple[str, datetime]:
    """A zone and a local wall minute, within two hours of one of its transitions if it has
    any (1973-2037: offsets in whole minutes, as the oracle's minute visits need)."""
    name = draw(st.sampled_from(ALL_ZONES))
    zone = get_zone(name)
    found = transitions(name, zone)
    if not found:
        return name, local_wall(draw(st.integers(LOW, HIGH)) // 60 * 60, zone)
    near = draw(st.sampled_from(found)) + draw(st.integers(-7200, 7200))
    return name, local_wall(near // 60 * 60, zone)


@SETTINGS
@given(
    where=wall_near_a_transition(),
    dst=st.builds(DstPolicy, st.sampled_from(Gap), st.sampled_from(Repeat)),
)
def test_a_one_shot_resolves_as_the_oracle_says_in_every_zone(
    where: tuple[str, datetime], dst: DstPolicy
) -> None:
    # GIVEN a local wall time near a transition of any zone, and any DST choice
    name, wall = where
    zone = get_zone(name)
    # AND the oracle's visits of it: every UTC minute within a day whose clock shows it
    base = int(wall.replace(tzinfo=get_zone("UTC")).timestamp())
    visits = [
        i for i in range(base - 30 * 3600, base + 30 * 3600, 60) if local_wall(i, zone) == wall
    ]
    # WHEN it is resolved as a one-shot's `at`
    try:
        resolved = resolve_at(wall.isoformat(), name, dst)
    except NoSuchWallTime:
        # THEN a wall time never shown is refused only when the gap choice is SKIP
        assert not visits
        assert dst.gap is Gap.SKIP
        return
    got = [resolved.instant] + ([resolved.second] if resolved.second is not None else [])
    if visits:
        # THEN it fires at the visits the repeat choice picks
        assert got == choose(visits, dst.repeat.value)
    else:
        # THEN a wall time never shown fires at the end of its gap (SHIFT)
        assert dst.gap is Gap.SHIFT
        before = max(i for i in range(base - 30 * 3600, base, 60) if local_wall(i, zone) < wall)
        assert got == [jump_instant(zone, before, before + 60)]


@pytest.mark.parametrize("start", ["1988-10-29T23:51:00Z", "1988-10-29T23:50:00Z"])
def test_next_after_past_the_utc_day_takes_the_soonest_second_pass_fire(start: str):
    # GIVEN St. John's double daylight time ending on 1988-10-30 at 01:31Z: the clocks went
    # back two hours (22:01-00:00 local twice), and '10,20 22 * * *' fired at BOTH: 22:10 at
    # 23:40Z and 01:40Z, 22:20 at 23:50Z and 01:50Z
    rule = CronRule(
        parse_cron("10,20 22 * * *"),
        get_zone("America/St_Johns"),
        dst=DstPolicy(repeat=Repeat.BOTH),
    )
    # WHEN the next fire is asked after both first-pass fires (the UTC day has no fire left,
    # so the calendar is walked)
    fire = rule.next_after(_epoch(start))
    # THEN it is the soonest second-pass fire, 22:10's, not the last step's nor the start
    assert fire is not None
    assert utc_text(fire) == "1988-10-30T01:40:00Z"


@pytest.mark.parametrize(
    ("expr", "gap", "wall"),
    [
        ("30 2 * * *", Gap.SHIFT, "2026-03-08T02:30:00"),  # the skipped wall time it is
        ("*/15 2 * * *", Gap.SHIFT, "2026-03-08T02:00:00"),  # the earliest of several
        ("*/15 2-3 * * *", Gap.SHIFT, "2026-03-08T03:00:00"),  # 03:00 matches by itself
        ("0 3 * * *", Gap.SKIP, "2026-03-08T03:00:00"),
    ],
)
def test_a_fire_at_a_gaps_end_is_the_wall_time_it_matched(expr: str, gap: Gap, wall: str):
    # GIVEN New York's gap of 2026-03-08 (02:00-03:00 EST skipped; it ends at 07:00Z)
    rule = CronRule(parse_cron(expr), get_zone("America/New_York"), dst=DstPolicy(gap))
    # THEN the fire at its end is the wall time the expression matched there
    assert rule.matched_wall(_epoch("2026-03-08T07:00:00Z")).isoformat() == wall
    # AND an instant no fire is at (a stray the reconciler reads) is its own wall time
    assert rule.matched_wall(_epoch("2026-03-08T07:31:00Z")).isoformat() == "2026-03-08T03:31:00"


def test_the_default_choice_written_out_is_no_choice():
    # GIVEN a cron with the defaults written out; WHEN it is read
    spec = SPEC.validate_python(
        {
            "kind": "cron",
            "expression": "0 2 * * *",
            "timezone": "UTC",
            "dst": {"gap": "SKIP", "repeat": "FIRST"},
        }
    )
    # THEN it is the same definition as one with none (a change to it makes no version)
    assert spec == SPEC.validate_python(
        {"kind": "cron", "expression": "0 2 * * *", "timezone": "UTC"}
    )

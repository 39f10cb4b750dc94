"""parse_cron: what the five-field grammar accepts, what it rejects, and why.

Expected value sets are written out by hand from the cron grammar (cronie's reading),
not produced by the parser.
"""

from __future__ import annotations

from datetime import date

import pytest

from punctual.timing import MACROS, CronError, CronExpr, parse_cron

ALL_MINUTES = tuple(range(60))
ALL_HOURS = tuple(range(24))
ALL_DAYS = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_WEEKDAYS = frozenset(range(7))


# --- accepted forms -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "minutes"),
    [
        pytest.param("*", ALL_MINUTES, id="star"),
        pytest.param("7", (7,), id="single"),
        pytest.param("0,15,45", (0, 15, 45), id="list"),
        pytest.param("45,0,15,15", (0, 15, 45), id="list_unsorted_with_duplicate"),
        pytest.param("10-13", (10, 11, 12, 13), id="range"),
        pytest.param("*/15", (0, 15, 30, 45), id="star_step"),
        pytest.param("1-10/3", (1, 4, 7, 10), id="range_step"),
        pytest.param("5/20", (5, 25, 45), id="start_step_runs_to_max"),
        pytest.param("58/5", (58,), id="start_step_single_value"),
        pytest.param("0-59/30", (0, 30), id="full_range_step"),
        pytest.param("1-3,50-59/4", (1, 2, 3, 50, 54, 58), id="list_of_ranges"),
        pytest.param("*/100", (0,), id="step_larger_than_field"),
        pytest.param("59", (59,), id="upper_edge"),
    ],
)
def test_parse_cron_minute_field_forms(expression: str, minutes: tuple[int, ...]):
    # GIVEN a minute field written in one of the supported forms
    # WHEN the expression is parsed
    expr = parse_cron(f"{expression} * * * *")
    # THEN the minute set is exactly the one the grammar describes, sorted
    assert expr.minutes == minutes


def test_parse_cron_every_field_gets_its_own_value_set():
    # GIVEN an expression restricting every field differently
    # WHEN it is parsed
    expr = parse_cron("5 4-6 1,15 2/5 1-5")
    # THEN each field's set is independent of the others
    assert expr.minutes == (5,)
    assert expr.hours == (4, 5, 6)
    assert expr.days == frozenset({1, 15})
    assert expr.months == frozenset({2, 7, 12})
    assert expr.weekdays == frozenset({1, 2, 3, 4, 5})


def test_parse_cron_hour_step_from_start_runs_to_23():
    # GIVEN 'a/s' in the hour field; WHEN parsed
    expr = parse_cron("0 3/8 * * *")
    # THEN it runs from a to the end of the field (23) in steps of s
    assert expr.hours == (3, 11, 19)


@pytest.mark.parametrize(
    ("month_field", "months"),
    [
        pytest.param("jan", {1}, id="lower"),
        pytest.param("DEC", {12}, id="upper"),
        pytest.param("Jun", {6}, id="title"),
        pytest.param("jan-MAR", {1, 2, 3}, id="range_mixed_case"),
        pytest.param("feb,Aug,nov", {2, 8, 11}, id="list"),
        pytest.param("jan-dec/3", {1, 4, 7, 10}, id="named_range_step"),
        pytest.param("3,apr", {3, 4}, id="numbers_and_names"),
    ],
)
def test_parse_cron_month_names_case_insensitive(month_field: str, months: set[int]):
    # GIVEN month names in any case, alone, in ranges and in lists
    # WHEN parsed
    expr = parse_cron(f"0 0 1 {month_field} *")
    # THEN they map to month numbers 1..12
    assert expr.months == frozenset(months)


@pytest.mark.parametrize(
    ("dow_field", "weekdays"),
    [
        pytest.param("sun", {0}, id="sun"),
        pytest.param("SAT", {6}, id="sat_upper"),
        pytest.param("Mon-Fri", {1, 2, 3, 4, 5}, id="weekday_range"),
        pytest.param("mon,WED,fri", {1, 3, 5}, id="list"),
        pytest.param("0", {0}, id="zero_is_sunday"),
        pytest.param("7", {0}, id="seven_is_sunday"),
        pytest.param("0,7", {0}, id="both_sundays_fold"),
        pytest.param("5-7", {5, 6, 0}, id="range_through_seven"),
        pytest.param("sun-sat", {0, 1, 2, 3, 4, 5, 6}, id="sun_to_sat"),
    ],
)
def test_parse_cron_day_of_week_names_and_sunday(dow_field: str, weekdays: set[int]):
    # GIVEN a day-of-week field with names or both spellings of Sunday
    # WHEN parsed
    expr = parse_cron(f"0 0 * * {dow_field}")
    # THEN weekdays are 0..6 with Sunday always 0, never 7
    assert expr.weekdays == frozenset(weekdays)
    assert 7 not in expr.weekdays


def test_parse_cron_dow_zero_and_seven_fire_on_the_same_days():
    # GIVEN the same schedule with Sunday written as 0 and as 7
    zero, seven = parse_cron("0 0 * * 0"), parse_cron("0 0 * * 7")
    # WHEN asking which days of a fortnight match
    days = [date(2026, 1, d) for d in range(1, 15)]
    # THEN both match exactly the Sundays (2026-01-04 and 2026-01-11)
    expected = [date(2026, 1, 4), date(2026, 1, 11)]
    assert [d for d in days if zero.matches_date(d)] == expected
    assert [d for d in days if seven.matches_date(d)] == expected


def test_parse_cron_normalises_whitespace_in_source():
    # GIVEN an expression with tabs, runs of spaces and padding
    # WHEN parsed
    expr = parse_cron("  0\t9   *  * \t mon-fri ")
    # THEN fields are read normally and the source is the single-spaced form
    assert expr.source == "0 9 * * mon-fri"
    assert expr.hours == (9,)


MACRO_EXPANSIONS = {
    "@hourly": (ALL_HOURS, ALL_DAYS, ALL_WEEKDAYS, ALL_MONTHS),
    "@daily": ((0,), ALL_DAYS, ALL_WEEKDAYS, ALL_MONTHS),
    "@midnight": ((0,), ALL_DAYS, ALL_WEEKDAYS, ALL_MONTHS),
    "@weekly": ((0,), ALL_DAYS, frozenset({0}), ALL_MONTHS),
    "@monthly": ((0,), frozenset({1}), ALL_WEEKDAYS, ALL_MONTHS),
    "@yearly": ((0,), frozenset({1}), ALL_WEEKDAYS, frozenset({1})),
    "@annually": ((0,), frozenset({1}), ALL_WEEKDAYS, frozenset({1})),
}


@pytest.mark.parametrize("spelling", ["lower", "upper", "title"])
@pytest.mark.parametrize("macro", sorted(MACRO_EXPANSIONS))
def test_parse_cron_macros_case_insensitive(macro: str, spelling: str):
    # GIVEN a macro written in some case
    text = {"lower": macro, "upper": macro.upper(), "title": "@" + macro[1:].title()}[spelling]
    # WHEN parsed
    expr = parse_cron(text)
    # THEN it expands to the classic five fields (minute 0 everywhere)
    hours, days, weekdays, months = MACRO_EXPANSIONS[macro]
    assert expr.minutes == (0,)
    assert (expr.hours, expr.days, expr.weekdays, expr.months) == (hours, days, weekdays, months)


def test_parse_cron_macro_table_is_exactly_the_documented_set():
    # GIVEN the documented macros; WHEN comparing with the parser's table
    # THEN nothing is missing and nothing extra (e.g. @reboot) is accepted
    assert set(MACROS) == set(MACRO_EXPANSIONS)


# --- restriction flags (cronie) -----------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "dom_restricted", "dow_restricted"),
    [
        pytest.param("0 0 * * *", False, False, id="both_star"),
        pytest.param("0 0 */2 * *", False, False, id="dom_star_step_unrestricted"),
        pytest.param("0 0 * * */2", False, False, id="dow_star_step_unrestricted"),
        pytest.param("0 0 *,5 * 1", False, True, id="dom_star_list_unrestricted"),
        pytest.param("0 0 1-31 * *", True, False, id="dom_full_range_is_restricted"),
        pytest.param("0 0 * * 0-7", False, True, id="dow_full_range_is_restricted"),
        pytest.param("0 0 13 * 5", True, True, id="both_restricted"),
        pytest.param("0 0 1/2 * mon", True, True, id="start_step_restricted"),
        pytest.param("@monthly", True, False, id="monthly_macro"),
        pytest.param("@weekly", False, True, id="weekly_macro"),
    ],
)
def test_parse_cron_restriction_flags_follow_cronie(
    expression: str, dom_restricted: bool, dow_restricted: bool
):
    # GIVEN a day-of-month / day-of-week combination
    # WHEN parsed
    expr = parse_cron(expression)
    # THEN a field is unrestricted exactly when its text begins with '*'
    assert (expr.dom_restricted, expr.dow_restricted) == (dom_restricted, dow_restricted)


def test_parse_cron_full_range_dom_with_dow_is_or():
    # GIVEN '1-31' (restricted, though it lists every day) with 'mon'
    expr = parse_cron("0 0 1-31 * mon")
    # WHEN asking about a Tuesday
    # THEN the OR rule applies and every day fires (unlike '* * mon')
    assert expr.matches_date(date(2026, 1, 6))
    assert not parse_cron("0 0 * * mon").matches_date(date(2026, 1, 6))


def test_parse_cron_star_step_dom_with_dow_is_and():
    # GIVEN '*/2' day-of-month (unrestricted by cronie's rule) with Friday
    expr = parse_cron("0 0 */2 * fri")
    # WHEN asking about odd and even Fridays and an odd non-Friday
    # THEN both must match: 2026-01-09 (odd Fri) yes, 2026-01-16 (even Fri) no, 01-07 no
    assert expr.matches_date(date(2026, 1, 9))
    assert not expr.matches_date(date(2026, 1, 16))
    assert not expr.matches_date(date(2026, 1, 7))


def test_parse_cron_dom_31_feb_with_monday_is_accepted_and_fires_mondays():
    # GIVEN 31 February (impossible) OR Monday
    # WHEN parsed
    expr = parse_cron("0 0 31 2 mon")
    # THEN it is accepted: both fields restricted -> OR, so February Mondays fire
    assert (expr.dom_restricted, expr.dow_restricted) == (True, True)
    feb = [date(2026, 2, d) for d in range(1, 29)]
    assert [d.day for d in feb if expr.matches_date(d)] == [2, 9, 16, 23]
    assert not expr.matches_date(date(2026, 3, 2))  # a Monday, but not in February


# --- rejections ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message_parts"),
    [
        pytest.param("* * * * * *", ["expected 5 fields", "got 6"], id="six_fields"),
        pytest.param("0 0 * * * 2026", ["expected 5 fields", "got 6"], id="year_field"),
        pytest.param("* * * *", ["expected 5 fields", "got 4"], id="four_fields"),
        pytest.param("", ["empty"], id="empty"),
        pytest.param(" \t ", ["empty"], id="blank"),
        pytest.param("60 * * * *", ["minute field", "60", "outside 0-59"], id="minute_60"),
        pytest.param("0 24 * * *", ["hour field", "24", "outside 0-23"], id="hour_24"),
        pytest.param("0 0 0 * *", ["day-of-month field", "0", "outside 1-31"], id="dom_0"),
        pytest.param("0 0 32 * *", ["day-of-month field", "32", "outside 1-31"], id="dom_32"),
        pytest.param("0 0 * 13 *", ["month field", "13", "outside 1-12"], id="month_13"),
        pytest.param("0 0 * 0 *", ["month field", "0", "outside 1-12"], id="month_0"),
        pytest.param("0 0 * * 8", ["day-of-week field", "8", "outside 0-7"], id="dow_8"),
        pytest.param("0 0-24 * * *", ["hour field", "24", "outside"], id="range_end_too_high"),
        pytest.param("*/0 * * * *", ["minute field", "step", "at least 1"], id="step_0"),
        pytest.param("0 0 1-10/0 * *", ["day-of-month field", "step"], id="range_step_0"),
        pytest.param("*/ * * * *", ["minute field", "step", "positive number"], id="step_missing"),
        pytest.param("*/x * * * *", ["minute field", "step"], id="step_not_number"),
        pytest.param("*/-2 * * * *", ["minute field", "step"], id="step_negative"),
        pytest.param("5-1 * * * *", ["minute field", "'5-1'", "backwards"], id="backwards"),
        pytest.param("0 0 * * fri-mon", ["day-of-week field", "backwards"], id="names_back"),
        pytest.param("0 0 * foo *", ["month field", "'foo'", "not a number"], id="bad_month"),
        pytest.param("0 0 * * funday", ["day-of-week field", "'funday'"], id="bad_day"),
        pytest.param("0 0 * * jan", ["day-of-week field", "'jan'"], id="month_name_as_dow"),
        pytest.param("0 0 * mon *", ["month field", "'mon'"], id="day_name_as_month"),
        pytest.param("0 0 * * ?", ["day-of-week field", "'?'"], id="question_dow"),
        pytest.param("0 0 ? * *", ["day-of-month field", "'?'"], id="question_dom"),
        pytest.param("0 0 L * *", ["day-of-month field", "'L'"], id="last_day_L"),
        pytest.param("0 0 * * 5L", ["day-of-week field", "'5L'"], id="last_weekday_L"),
        pytest.param("0 0 * * 5#2", ["day-of-week field", "'5#2'"], id="nth_weekday_hash"),
        pytest.param("0 0 15W * *", ["day-of-month field", "'15W'"], id="nearest_weekday_W"),
        pytest.param("1,,2 * * * *", ["minute field", "'1,,2'", "empty list item"], id="empty"),
        pytest.param("1, * * * *", ["minute field", "empty list item"], id="trailing_comma"),
        pytest.param(",1 * * * *", ["minute field", "empty list item"], id="leading_comma"),
        pytest.param("-1 * * * *", ["minute field", "not a number"], id="negative"),
        pytest.param("1- * * * *", ["minute field", "not a number"], id="open_range"),
        pytest.param("@reboot", ["unknown macro", "'@reboot'"], id="reboot"),
        pytest.param("@every_5m", ["unknown macro", "'@every_5m'"], id="unknown_macro"),
        pytest.param("@daily 5", ["unknown macro"], id="macro_with_extra_text"),
        pytest.param("@", ["unknown macro"], id="bare_at"),
    ],
)
def test_parse_cron_rejects_with_field_and_reason(expression: str, message_parts: list[str]):
    # GIVEN an expression outside the supported grammar
    # WHEN it is parsed
    with pytest.raises(CronError) as caught:
        parse_cron(expression)
    # THEN the CronError message names the field (or form) and the reason
    message = str(caught.value)
    for part in message_parts:
        assert part in message


def test_parse_cron_unknown_macro_lists_the_known_ones():
    # GIVEN an unknown macro; WHEN parsed
    with pytest.raises(CronError) as caught:
        parse_cron("@fortnightly")
    # THEN the message offers every supported macro
    for macro in MACROS:
        assert macro in str(caught.value)


def test_parse_cron_error_is_a_value_error():
    # GIVEN a bad expression; WHEN parsed
    # THEN the CronError is also a ValueError, so pydantic validators report it on the field
    with pytest.raises(ValueError, match="minute field"):
        parse_cron("61 * * * *")


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("0 0 30 2 *", id="feb_30"),
        pytest.param("0 0 31 2 *", id="feb_31"),
        pytest.param("0 0 31 4,6,9,11 *", id="31_in_30_day_months"),
        pytest.param("0 0 30,31 feb *", id="feb_30_31_by_name"),
        pytest.param("0 0 30 2 */2", id="dow_star_step_keeps_and"),
        pytest.param("0 0 31 apr-jun/2 *", id="apr_jun_only"),
    ],
)
def test_parse_cron_rejects_never_firing(expression: str):
    # GIVEN a day-of-month that no chosen month has, with the weekday unrestricted
    # WHEN parsed
    with pytest.raises(CronError) as caught:
        parse_cron(expression)
    # THEN it is rejected up front, quoting the expression
    assert "can never fire" in str(caught.value)
    assert repr(expression) in str(caught.value)


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("0 0 29 2 *", id="leap_day"),
        pytest.param("0 0 31 4,5 *", id="one_month_has_31"),
        pytest.param("0 0 30,31 2,3 *", id="march_has_them"),
        pytest.param("0 0 30 2 fri", id="or_with_weekday"),
    ],
)
def test_parse_cron_accepts_rare_but_possible_dates(expression: str):
    # GIVEN a date that exists in at least one chosen month (or a weekday OR)
    # WHEN parsed
    expr = parse_cron(expression)
    # THEN it is accepted as written
    assert isinstance(expr, CronExpr)
    assert expr.source == expression


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("\u00b2 * * * *", id="superscript_value"),
        pytest.param("*/\u00b2 * * * *", id="superscript_step"),
    ],
)
def test_parse_cron_superscript_digit_rejected_with_cron_error(expression: str):
    # GIVEN a minute field containing a superscript two (a 'digit' to str.isdigit)
    # WHEN parsed
    with pytest.raises(CronError) as caught:
        parse_cron(expression)
    # THEN the error is a CronError that names the field
    assert "minute field" in str(caught.value)

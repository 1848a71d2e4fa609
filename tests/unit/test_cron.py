"""Cron parsing and fire times, including the DST rules: a missing wall time fires once at the
end of the gap; in a repeated hour an interval-like expression (minute or hour field starting with
'*') fires in both passes, any other expression once, at the first occurrence."""

from __future__ import annotations

import datetime as dt
import time
import zoneinfo

import pytest

from skiplock.engine.cron import CronExpression, parse_timezone
from skiplock.engine.errors import InvalidInput

UTC = dt.timezone.utc
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def fields(expr: CronExpression) -> tuple:
    return (
        set(expr.minutes),
        set(expr.hours),
        set(expr.days_of_month),
        set(expr.months),
        set(expr.days_of_week),
        expr.day_fields_are_alternatives,
    )


def fires(text: str, after: dt.datetime, count: int, tz: zoneinfo.ZoneInfo = zoneinfo.ZoneInfo("UTC")):
    expr = CronExpression.parse(text)
    result = []
    for _ in range(count):
        after = expr.next_after(after, tz)
        result.append(after)
    return result


ALL_MINUTES = set(range(60))
ALL_HOURS = set(range(24))
ALL_DAYS = set(range(1, 32))
ALL_MONTHS = set(range(1, 13))
ALL_WEEKDAYS = set(range(7))


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "alias, expansion",
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_aliases_mean_their_expansion(alias, expansion):
    expr = CronExpression.parse(alias)
    assert expr.text == alias
    assert fields(expr) == fields(CronExpression.parse(expansion))
    assert CronExpression.parse(f"  {alias.upper()} ").text == alias.upper()


def test_star_fields_cover_the_whole_range():
    assert fields(CronExpression.parse("* * * * *")) == (
        ALL_MINUTES, ALL_HOURS, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS, False
    )
    assert fields(CronExpression.parse("@weekly"))[4] == {0}


def test_lists_ranges_and_steps():
    expr = CronExpression.parse("1,5-7,*/30 10-20/5 1/3 2-12/4 1-5")
    assert set(expr.minutes) == {0, 1, 5, 6, 7, 30}
    assert set(expr.hours) == {10, 15, 20}
    assert set(expr.days_of_month) == {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31}
    assert set(expr.months) == {2, 6, 10}
    assert set(expr.days_of_week) == {1, 2, 3, 4, 5}


def test_n_slash_step_means_n_to_max():
    assert set(CronExpression.parse("50/3 * * * *").minutes) == {50, 53, 56, 59}
    assert set(CronExpression.parse("0 20/2 * * *").hours) == {20, 22}
    assert set(CronExpression.parse("*/20 * * * *").minutes) == {0, 20, 40}
    assert set(CronExpression.parse("*/100 * * * *").minutes) == {0}  # a step beyond the range fires once
    # day-of-week counts to 7 like Vixie cron, and 7 is Sunday
    assert set(CronExpression.parse("0 0 * * 1/3").days_of_week) == {1, 4, 0}


def test_names_are_case_insensitive_and_work_in_ranges_and_lists():
    expr = CronExpression.parse("0 0 * jan-Mar,dec mon,Wed-fri")
    assert set(expr.months) == {1, 2, 3, 12}
    assert set(expr.days_of_week) == {1, 3, 4, 5}
    assert set(CronExpression.parse("0 0 * * SAT,SUN").days_of_week) == {6, 0}


def test_seven_is_sunday():
    assert set(CronExpression.parse("0 0 * * 7").days_of_week) == {0}
    assert set(CronExpression.parse("0 0 * * 0,7").days_of_week) == {0}
    assert set(CronExpression.parse("0 0 * * 5-7").days_of_week) == {5, 6, 0}


def test_whitespace_is_tolerated_and_normalized():
    expr = CronExpression.parse("  */5\t1-3   * *\n * ")
    assert expr.text == "*/5 1-3 * * *"
    assert set(expr.hours) == {1, 2, 3}


def test_day_fields_are_alternatives_only_when_both_are_restricted():
    assert CronExpression.parse("0 0 13 * FRI").day_fields_are_alternatives
    assert not CronExpression.parse("0 0 13 * *").day_fields_are_alternatives
    assert not CronExpression.parse("0 0 * * FRI").day_fields_are_alternatives
    assert not CronExpression.parse("0 0 */13 * FRI").day_fields_are_alternatives  # starts with '*'
    assert not CronExpression.parse("0 0 13 * */2").day_fields_are_alternatives


@pytest.mark.parametrize(
    "text, message",
    [
        ("61 * * * *", "cron '61 * * * *': minute 61 out of range 0-59"),
        ("0 24 * * *", "cron '0 24 * * *': hour 24 out of range 0-23"),
        ("0 0 0 * *", "cron '0 0 0 * *': day-of-month 0 out of range 1-31"),
        ("0 0 32 * *", "cron '0 0 32 * *': day-of-month 32 out of range 1-31"),
        ("0 0 1 13 *", "cron '0 0 1 13 *': month 13 out of range 1-12"),
        ("0 0 * * 8", "cron '0 0 * * 8': day-of-week 8 out of range 0-7"),
        ("0 0 1-40 * *", "cron '0 0 1-40 * *': day-of-month 40 out of range 1-31"),
        (
            "foo",
            "cron 'foo': expected 5 fields (minute hour day-of-month month day-of-week)"
            " or an alias like @hourly",
        ),
        ("* * * *", "cron '* * * *': expected 5 fields"),
        ("* * * * * *", "cron '* * * * * *': expected 5 fields"),
        ("", "cron '': expected 5 fields"),
        ("   ", "cron '': expected 5 fields"),
        ("*/0 * * * *", "cron '*/0 * * * *': minute step 0 must be at least 1"),
        ("0 */x * * *", "cron '0 */x * * *': hour step 'x' is not a number"),
        ("0 1-5/ * * *", "cron '0 1-5/ * * *': hour step '' is not a number"),
        ("0 5-2 * * *", "cron '0 5-2 * * *': hour range 5-2 is backwards (5 > 2)"),
        ("0 0 * * FRI-MON", "cron '0 0 * * FRI-MON': day-of-week range FRI-MON is backwards (5 > 1)"),
        ("0 0 1 FOO *", "cron '0 0 1 FOO *': month 'FOO' is not a number or a name JAN-DEC"),
        ("0 0 1 * FUNDAY", "cron '0 0 1 * FUNDAY': day-of-week 'FUNDAY' is not a number or a name SUN-SAT"),
        ("0 MON * * *", "cron '0 MON * * *': hour 'MON' is not a number"),
        ("x/2 * * * *", "cron 'x/2 * * * *': minute 'x' is not a number"),
        ("-1 * * * *", "cron '-1 * * * *': minute '-1' is incomplete"),
        ("1,,2 * * * *", "cron '1,,2 * * * *': minute '1,,2' has an empty list item"),
        ("@reboot", "cron '@reboot': @reboot is not supported"),
        ("@fortnightly", "cron '@fortnightly': unknown alias (expected one of @yearly, @annually"),
        ("@hourly 5", "cron '@hourly 5': an alias like @hourly stands alone"),
        ("0 0 30 2 *", "cron '0 0 30 2 *': never fires (no date has day-of-month 30 in month 2"),
        ("0 0 31 4 *", "cron '0 0 31 4 *': never fires (no date has day-of-month 31 in month 4"),
        ("0 0 30,31 FEB *", "cron '0 0 30,31 FEB *': never fires"),
        ("0 0 31 2,4,6,9,11 *", "cron '0 0 31 2,4,6,9,11 *': never fires"),
        ("0 0 31 4 */2", "cron '0 0 31 4 */2': never fires"),
        # L, LW, 5L and MON#1 belong in the day fields, with one day before L or #
        ("L * * * *", "cron 'L * * * *': minute 'L' is not a number (L and # belong in day-of-month and day-of-week)"),
        ("0 5L * * *", "cron '0 5L * * *': hour '5L' is not a number (L and # belong"),
        ("0 0 1 L *", "cron '0 0 1 L *': month 'L' is not a number or a name JAN-DEC (L and # belong"),
        ("0 0 * * MON#6", "cron '0 0 * * MON#6': day-of-week 'MON#6': the week after # must be 1-5"),
        ("0 0 * * 1#0", "cron '0 0 * * 1#0': day-of-week '1#0': the week after # must be 1-5"),
        ("0 0 * * MON#", "cron '0 0 * * MON#': day-of-week 'MON#': the week after # must be 1-5"),
        ("0 0 * * #2", "cron '0 0 * * #2': day-of-week '#2' needs a day first, like 5L or MON#1"),
        ("0 0 * * L", "cron '0 0 * * L': day-of-week 'L' needs a day first, like 5L or MON#1"),
        ("0 0 * * 1-5L", "cron '0 0 * * 1-5L': day-of-week '1-5L': L and # follow one day, like 5L or MON#1"),
        ("0 0 * * */2#1", "cron '0 0 * * */2#1': day-of-week '*/2#1': L and # follow one day"),
        ("0 0 * * 32L", "cron '0 0 * * 32L': day-of-week 32 out of range 0-7"),
        ("0 0 * * FUNL", "cron '0 0 * * FUNL': day-of-week 'FUN' is not a number or a name SUN-SAT"),
        ("0 0 32L * *", "cron '0 0 32L * *': day-of-month '32L' is not a number, L (last day) or LW (last weekday)"),
        ("0 0 5L * *", "cron '0 0 5L * *': day-of-month '5L' is not a number, L (last day)"),
        ("0 0 L-2 * *", "cron '0 0 L-2 * *': day-of-month 'L-2' is not a number, L (last day)"),
        ("0 0 15W * *", "cron '0 0 15W * *': day-of-month '15W' is not a number, L (last day)"),
        ("0 0 L/2 * *", "cron '0 0 L/2 * *': day-of-month 'L/2' is not a number, L (last day)"),
        ("0 0 L,,1 * *", "cron '0 0 L,,1 * *': day-of-month 'L,,1' has an empty list item"),
        ("0 0 */8 * MON#5", "cron '0 0 */8 * MON#5': never fires (no date has day-of-month */8"),
    ],
)
def test_bad_expressions_name_the_field_and_value(text, message):
    with pytest.raises(InvalidInput) as caught:
        CronExpression.parse(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "value, message",
    [(None, "cron None: expected a string, got NoneType"), (15, "cron 15: expected a string, got int")],
)
def test_non_strings_are_rejected(value, message):
    with pytest.raises(InvalidInput, match=message):
        CronExpression.parse(value)


def test_rare_but_possible_dates_are_accepted():
    CronExpression.parse("0 0 29 2 *")  # leap days
    CronExpression.parse("0 0 31 4 MON")  # either rule: Mondays in April
    CronExpression.parse("0 0 29 2 */7")  # both rules: a leap day that is a Sunday (every ~28 years)


def test_expressions_are_immutable_values():
    expr = CronExpression.parse("0 9 * * MON-FRI")
    assert expr == CronExpression.parse("0  9 * * MON-FRI")
    with pytest.raises(AttributeError):
        expr.text = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- L, LW, 5L, MON#1


def dates(text: str, count: int, start: tuple = (2026, 1, 1)) -> list[str]:
    return [t.strftime("%Y-%m-%d %a") for t in fires(text, utc(*start), count)]


def test_l_is_the_last_day_of_the_month():
    assert dates("0 0 L * *", 4) == ["2026-01-31 Sat", "2026-02-28 Sat", "2026-03-31 Tue", "2026-04-30 Thu"]
    assert dates("0 0 L 2 *", 3) == ["2026-02-28 Sat", "2027-02-28 Sun", "2028-02-29 Tue"]
    assert dates("0 0 1,L * *", 3) == ["2026-01-31 Sat", "2026-02-01 Sun", "2026-02-28 Sat"]
    assert dates("0 0 l * *", 1) == dates("0 0 L * *", 1)


def test_lw_is_the_last_weekday_of_the_month():
    # January 31 and February 28 are Saturdays, May 31 a Sunday: the Friday before fires
    assert dates("0 0 LW * *", 5) == [
        "2026-01-30 Fri", "2026-02-27 Fri", "2026-03-31 Tue", "2026-04-30 Thu", "2026-05-29 Fri"
    ]


def test_day_of_week_l_is_the_last_such_day_of_the_month():
    assert dates("0 0 * * 5L", 3) == ["2026-01-30 Fri", "2026-02-27 Fri", "2026-03-27 Fri"]
    assert dates("0 0 * * FRIL", 3) == dates("0 0 * * 5L", 3)
    assert dates("0 0 * * 7L", 2) == dates("0 0 * * 0L", 2) == ["2026-01-25 Sun", "2026-02-22 Sun"]


def test_hash_is_the_nth_such_day_of_the_month():
    assert dates("0 0 * * MON#1", 3) == ["2026-01-05 Mon", "2026-02-02 Mon", "2026-03-02 Mon"]
    assert dates("0 0 * * 1#1", 3) == dates("0 0 * * mon#1", 3) == dates("0 0 * * MON#1", 3)
    assert dates("0 0 * * SUN#2", 2) == dates("0 0 * * 7#2", 2) == ["2026-01-11 Sun", "2026-02-08 Sun"]
    assert dates("0 0 * * MON#1,FRIL", 4) == ["2026-01-05 Mon", "2026-01-30 Fri", "2026-02-02 Mon", "2026-02-27 Fri"]
    assert dates("0 0 * 2 MON#5", 2) == ["2044-02-29 Mon", "2072-02-29 Mon"]  # a leap day on a Monday


def test_the_vixie_rule_holds_for_the_new_syntax():
    # both day fields restricted: either matches (the last day, or the first Monday)
    assert dates("0 0 L * MON#1", 4) == ["2026-01-05 Mon", "2026-01-31 Sat", "2026-02-02 Mon", "2026-02-28 Sat"]
    # a day field starting with '*' makes both required: last Fridays on odd days
    assert dates("0 0 */2 * 5L", 3) == ["2026-02-27 Fri", "2026-03-27 Fri", "2026-05-29 Fri"]
    assert CronExpression.parse("0 0 L * 5L").day_fields_are_alternatives
    assert not CronExpression.parse("0 0 * * 5L").day_fields_are_alternatives


# ---------------------------------------------------------------- next_after in UTC


def test_every_quarter_hour():
    assert fires("*/15 * * * *", utc(2026, 1, 5, 10, 7, 30), 4) == [
        utc(2026, 1, 5, 10, 15), utc(2026, 1, 5, 10, 30), utc(2026, 1, 5, 10, 45), utc(2026, 1, 5, 11, 0)
    ]


def test_weekdays_skip_the_weekend():
    # 2026-01-09 is a Friday
    assert fires("0 9 * * MON-FRI", utc(2026, 1, 9, 10, 0), 2) == [
        utc(2026, 1, 12, 9, 0), utc(2026, 1, 13, 9, 0)
    ]
    assert fires("0 9 * * MON-FRI", utc(2026, 1, 9, 8, 59, 59), 1) == [utc(2026, 1, 9, 9, 0)]


def test_first_of_month_across_month_and_year_end():
    assert fires("0 0 1 * *", utc(2026, 1, 31, 12, 0), 2) == [utc(2026, 2, 1), utc(2026, 3, 1)]
    assert fires("0 0 1 * *", utc(2026, 12, 15), 1) == [utc(2027, 1, 1)]
    assert fires("@yearly", utc(2026, 1, 1), 1) == [utc(2027, 1, 1)]


def test_leap_day_only_in_leap_years():
    assert fires("0 0 29 2 *", utc(2027, 3, 1), 3) == [utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)]
    assert fires("0 0 29 2 *", utc(2096, 3, 1), 1) == [utc(2104, 2, 29)]  # 2100 is not a leap year


def test_far_fire_times_are_found_without_walking_minutes():
    expr = CronExpression.parse("0 0 29 2 *")
    started = time.perf_counter()
    assert expr.next_after(utc(2027, 3, 1), zoneinfo.ZoneInfo("UTC")) == utc(2028, 2, 29)
    assert expr.next_after(utc(2096, 3, 1), BERLIN) == utc(2104, 2, 28, 23, 0)
    assert time.perf_counter() - started < 0.5


def test_vixie_rule_fires_on_either_day_field_when_both_are_restricted():
    # April 2026: Fridays are 3, 10, 17, 24; the 13th is a Monday
    assert fires("0 0 13 * FRI", utc(2026, 4, 1), 6) == [
        utc(2026, 4, 3), utc(2026, 4, 10), utc(2026, 4, 13),
        utc(2026, 4, 17), utc(2026, 4, 24), utc(2026, 5, 1),
    ]


def test_star_prefixed_day_field_makes_both_day_fields_required():
    # */13 = days 1, 14, 27 and it starts with '*', so only Fridays on those days fire
    assert fires("0 0 */13 * FRI", utc(2026, 1, 1), 3) == [
        utc(2026, 2, 27), utc(2026, 3, 27), utc(2026, 5, 1)
    ]


def test_result_is_strictly_after():
    assert fires("0 * * * *", utc(2026, 1, 5, 10, 0), 1) == [utc(2026, 1, 5, 11, 0)]
    assert fires("0 * * * *", utc(2026, 1, 5, 9, 59, 59, 999999), 1) == [utc(2026, 1, 5, 10, 0)]
    assert fires("0 * * * *", utc(2026, 1, 5, 10, 0, 0, 1), 1) == [utc(2026, 1, 5, 11, 0)]


def test_after_may_be_in_any_zone_and_the_result_is_utc():
    tokyo_noon = dt.datetime(2026, 1, 5, 12, 0, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo"))  # 03:00 UTC
    result = CronExpression.parse("0 * * * *").next_after(tokyo_noon, zoneinfo.ZoneInfo("UTC"))
    assert result == utc(2026, 1, 5, 4, 0)
    assert result.utcoffset() == dt.timedelta(0)
    assert result.tzinfo is UTC
    # the fields are read in the schedule's zone: 09:00 in Berlin is 08:00 UTC in winter
    assert CronExpression.parse("0 9 * * *").next_after(tokyo_noon, BERLIN) == utc(2026, 1, 5, 8, 0)


def test_naive_after_is_a_value_error():
    with pytest.raises(ValueError, match="timezone-aware"):
        CronExpression.parse("* * * * *").next_after(dt.datetime(2026, 1, 1), BERLIN)


# ---------------------------------------------------- spring forward: Berlin 2026-03-29, 02:00-02:59 missing


def test_missing_wall_time_fires_once_when_the_clocks_jump():
    assert fires("30 2 * * *", utc(2026, 3, 28, 12, 0), 2, BERLIN) == [
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the first minute after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_matches_inside_the_gap_collapse_into_one_fire():
    assert fires("*/15 * * * *", utc(2026, 3, 29, 0, 30), 4, BERLIN) == [
        utc(2026, 3, 29, 0, 45),  # 01:45 CET
        utc(2026, 3, 29, 1, 0),  # 02:00-02:45 and 03:00 CEST: one fire
        utc(2026, 3, 29, 1, 15),  # 03:15 CEST
        utc(2026, 3, 29, 1, 30),
    ]


def test_a_fire_right_after_the_gap_is_not_doubled():
    assert fires("0 3 * * *", utc(2026, 3, 28, 12, 0), 2, BERLIN) == [
        utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 1, 0)
    ]
    assert fires("0 2 * * *", utc(2026, 3, 29, 0, 59), 2, BERLIN) == [
        utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 0)
    ]


def test_a_gap_at_midnight_moves_the_daily_fire_to_the_end_of_the_gap():
    # Sao Paulo sprang from 00:00 to 01:00 on 2018-11-04
    assert fires("0 0 * * *", utc(2018, 11, 2, 12, 0), 3, zoneinfo.ZoneInfo("America/Sao_Paulo")) == [
        utc(2018, 11, 3, 3, 0), utc(2018, 11, 4, 3, 0), utc(2018, 11, 5, 2, 0)
    ]


def test_a_skipped_calendar_day_fires_once_when_the_day_after_starts():
    # Samoa skipped 2011-12-30 entirely (23:59 on the 29th at -10 was followed by 00:00 on the 31st at +14)
    assert fires("0 12 * * *", utc(2011, 12, 28, 23, 0), 3, zoneinfo.ZoneInfo("Pacific/Apia")) == [
        utc(2011, 12, 29, 22, 0), utc(2011, 12, 30, 10, 0), utc(2011, 12, 30, 22, 0)
    ]


# ---------------------------------------------------- fall back: Berlin 2026-10-25, 02:00-02:59 twice


def test_repeated_wall_time_fires_once_at_its_first_occurrence():
    assert fires("30 2 * * *", utc(2026, 10, 24, 12, 0), 2, BERLIN) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, not again at 02:30 CET
        utc(2026, 10, 26, 1, 30),
    ]
    assert fires("30 2 * * *", utc(2026, 10, 25, 0, 30), 1, BERLIN) == [utc(2026, 10, 26, 1, 30)]


def test_named_hours_fire_once_in_the_repeated_hour():
    # a range of hours names wall times: it is not interval-like (it does not start with '*')
    assert fires("0 1-3 * * *", utc(2026, 10, 24, 22, 30), 4, BERLIN) == [
        utc(2026, 10, 24, 23, 0),  # 01:00 CEST
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST, not again at 02:00 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
        utc(2026, 10, 26, 0, 0),  # 01:00 CET the next day
    ]


def test_hourly_fires_in_both_passes_of_the_repeated_hour():
    assert fires("0 * * * *", utc(2026, 10, 24, 22, 30), 4, BERLIN) == [
        utc(2026, 10, 24, 23, 0),  # 01:00 CEST
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]


def test_search_from_the_second_pass_does_not_refire_named_wall_times():
    # 01:10 UTC is 02:10 CET; 02:15, 02:30 and 02:45 already fired in the first pass
    assert fires("0,15,30,45 2 * * *", utc(2026, 10, 25, 1, 10), 2, BERLIN) == [
        utc(2026, 10, 26, 1, 0), utc(2026, 10, 26, 1, 15)
    ]


def test_search_from_the_second_pass_fires_the_rest_of_it():
    assert fires("*/15 * * * *", utc(2026, 10, 25, 1, 10), 4, BERLIN) == [
        utc(2026, 10, 25, 1, 15), utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 1, 45), utc(2026, 10, 25, 2, 0)
    ]


def test_search_from_the_first_pass_fires_the_rest_of_it_then_the_second_pass():
    assert fires("*/15 * * * *", utc(2026, 10, 25, 0, 10), 5, BERLIN) == [
        utc(2026, 10, 25, 0, 15), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 0, 45),  # 02:15-02:45 CEST
        utc(2026, 10, 25, 1, 0), utc(2026, 10, 25, 1, 15),  # 02:00, 02:15 CET
    ]
    # from inside the first pass, a wall time already passed (02:05 CEST) comes round again
    assert fires("5 * * * *", utc(2026, 10, 25, 0, 10), 2, BERLIN) == [
        utc(2026, 10, 25, 1, 5), utc(2026, 10, 25, 2, 5)  # 02:05 CET, 03:05 CET
    ]


def test_a_half_hour_fall_back_repeats_half_an_hour():
    # Lord Howe Island: 2026-04-05 02:00 (+11) -> 01:30 (+10:30), 01:30-01:59 twice
    lord_howe = zoneinfo.ZoneInfo("Australia/Lord_Howe")
    assert fires("*/20 * * * *", utc(2026, 4, 4, 14, 30), 4, lord_howe) == [
        utc(2026, 4, 4, 14, 40),  # 01:40 +11
        utc(2026, 4, 4, 15, 10),  # 01:40 +10:30
        utc(2026, 4, 4, 15, 30),  # 02:00 +10:30
        utc(2026, 4, 4, 15, 50),  # 02:20 +10:30
    ]
    assert fires("40 1 * * *", utc(2026, 4, 4, 14, 30), 2, lord_howe) == [
        utc(2026, 4, 4, 14, 40), utc(2026, 4, 5, 15, 10)  # 01:40 +11 once, then 01:40 +10:30 the next day
    ]


# ---------------------------------------------------- the fall-back and spring-forward nights, listed


def night(text: str, day: dt.date, tz: zoneinfo.ZoneInfo = BERLIN) -> list[dt.datetime]:
    """Every fire from local midnight (included) to 04:00 local (excluded) on `day`."""
    expr = CronExpression.parse(text)
    after = dt.datetime.combine(day, dt.time(0, 0), tzinfo=tz) - dt.timedelta(microseconds=1)
    end = dt.datetime.combine(day, dt.time(4, 0), tzinfo=tz)
    result = []
    while (after := expr.next_after(after, tz)) < end:
        result.append(after)
    return result


def gaps(instants: list[dt.datetime]) -> set[dt.timedelta]:
    return {b - a for a, b in zip(instants, instants[1:])}


FALL_BACK = dt.date(2026, 10, 25)  # Berlin: 03:00 CEST -> 02:00 CET, 02:00-02:59 twice
SPRING_FORWARD = dt.date(2026, 3, 29)  # Berlin: 02:00 CET -> 03:00 CEST, 02:00-02:59 missing


def test_a_quarter_hourly_schedule_fires_through_both_passes_of_the_repeated_hour():
    fire_times = night("*/15 * * * *", FALL_BACK)
    # 00:00 CEST (22:00 UTC) to 03:45 CET (02:45 UTC): five real hours, 20 quarters
    assert len(fire_times) == 20
    assert gaps(fire_times) == {dt.timedelta(minutes=15)}
    assert [t for t in fire_times if t.astimezone(BERLIN).hour == 2] == [
        utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 15), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 0, 45),
        utc(2026, 10, 25, 1, 0), utc(2026, 10, 25, 1, 15), utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 1, 45),
    ]


def test_an_hourly_schedule_fires_at_0200_cest_and_0200_cet():
    fire_times = night("0 * * * *", FALL_BACK)
    assert fire_times == [
        utc(2026, 10, 24, 22, 0),  # 00:00 CEST
        utc(2026, 10, 24, 23, 0),  # 01:00 CEST
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]
    assert gaps(fire_times) == {dt.timedelta(hours=1)}


def test_a_fixed_wall_time_fires_once_on_the_fall_back_night():
    assert night("30 2 * * *", FALL_BACK) == [utc(2026, 10, 25, 0, 30)]  # 02:30 CEST only
    assert night("0,30 2 * * *", FALL_BACK) == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30)]


def test_the_spring_forward_night_fires_skipped_times_once_when_the_clocks_jump():
    assert night("30 2 * * *", SPRING_FORWARD) == [utc(2026, 3, 29, 1, 0)]  # 03:00 CEST
    quarter_hourly = night("*/15 * * * *", SPRING_FORWARD)
    # 00:00-01:45 CET, then 02:00-02:45 (skipped) and 03:00 CEST are one fire, then 03:15-03:45 CEST
    assert len(quarter_hourly) == 8 + 1 + 3
    assert gaps(quarter_hourly) == {dt.timedelta(minutes=15)}
    assert night("0 * * * *", SPRING_FORWARD) == [
        utc(2026, 3, 28, 23, 0), utc(2026, 3, 29, 0, 0), utc(2026, 3, 29, 1, 0)  # 00:00, 01:00 CET, 03:00 CEST
    ]


# ---------------------------------------------------------------- a whole year


@pytest.mark.parametrize(
    "text, tz, dst_day_fire",
    [
        ("0 2 * * *", BERLIN, utc(2026, 3, 29, 1, 0)),  # gap: 03:00 CEST
        ("0 2 * * *", BERLIN, utc(2026, 10, 25, 0, 0)),  # repeated: 02:00 CEST
        ("30 1 * * *", NEW_YORK, utc(2026, 11, 1, 5, 30)),  # repeated: 01:30 EDT
        ("30 2 * * *", NEW_YORK, utc(2026, 3, 8, 7, 0)),  # gap: 03:00 EDT
    ],
)
def test_a_daily_schedule_fires_once_per_local_day_for_a_year(text, tz, dst_day_fire):
    expr = CronExpression.parse(text)
    start = dt.datetime(2026, 1, 1, tzinfo=tz)
    end = dt.datetime(2027, 1, 1, tzinfo=tz)
    fire_times = []
    after = start
    while (after := expr.next_after(after, tz)) < end:
        fire_times.append(after)
    assert len(fire_times) == 365
    assert all(a < b for a, b in zip(fire_times, fire_times[1:]))
    local_days = [t.astimezone(tz).date() for t in fire_times]
    assert local_days == [dt.date(2026, 1, 1) + dt.timedelta(days=n) for n in range(365)]
    assert dst_day_fire in fire_times


# ---------------------------------------------------------------- parse_timezone


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/New_York"])
def test_known_zones_parse(name):
    assert parse_timezone(name) == zoneinfo.ZoneInfo(name)
    assert parse_timezone(name).key == name


@pytest.mark.parametrize(
    "name", ["Mars/Base", "", "../etc/passwd", "/etc/passwd", "Europe", "Europe/Berlin\0"]
)
def test_unknown_zones_are_invalid_input_naming_the_value(name):
    with pytest.raises(InvalidInput) as caught:
        parse_timezone(name)
    assert str(caught.value) == f"timezone '{name}': unknown IANA time zone"


def test_non_string_zone_is_invalid_input():
    with pytest.raises(InvalidInput, match="timezone None"):
        parse_timezone(None)

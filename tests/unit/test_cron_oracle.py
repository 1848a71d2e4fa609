"""Differential test: our cron fire times against cronsim's (a test-only oracle) over DST transitions.

Random 5-field expressions (steps, ranges, lists, L, LW, 5L, MON#1) in zones with daylight saving,
from start instants near a transition: the first fires of `cronsim.CronSim(expr, start)` must be
ours. Every allowed difference is one of the exclusions below, each either our documented rule
(docs/GUIDE.md, Schedules, "Daylight saving") or a cronsim bug:

1. Our rule: an interval-like expression (minute or hour field starting with '*') whose wall time
   falls in a spring-forward gap fires once when the clocks jump, as every expression does here;
   cronsim, like Vixie cron, skips an interval-like job's times in the gap.
2. cronsim bug: an interval-like expression searches in real time, and cronsim moves to the next
   hour (or the next single minute) by adding 3600 s (or whole minutes) to the top of the current
   one. After a shift that is not a whole hour on the hour (Lord Howe's 30 minutes, Chatham's at
   :45) or from a midnight that does not exist (Havana, Sao Paulo, Apia), that lands past the
   start of a matching hour, so cronsim misses instants whose local time matches.
3. cronsim bug: it can go back in time. For named wall times it drops the start's fold, so from
   the second pass of a repeated stretch it returns times of the first pass, before the start
   (dropped). An interval-like search that enters a second pass steps back to the top of the
   hour, which is in the first pass when the stretch does not begin on the hour (Chatham repeats
   02:45-03:44), and returns earlier times again: the comparison stops there.
4. cronsim bug: it reads a range of one value with a step (`5-5/2`) as `5/2` (from 5 to the
   maximum); the generator does not write such ranges.

Each exclusion applies only while the installed cronsim still behaves so: `CRONSIM_DIFFERS` probes
each one on its own example, once, so a cronsim that fixes a bug is compared without that
exclusion (a difference it hid would then fail here), and never turns this file red by fixing one.
Our own side of each exclusion is checked by example without cronsim (`test_our_side_of_...`).
"""

from __future__ import annotations

import datetime as dt
import itertools
import zoneinfo
from functools import cache

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from skiplock.engine.cron import CronExpression
from skiplock.engine.errors import InvalidInput

UTC = dt.timezone.utc
FIRES = 8  # compared per example
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
LORD_HOWE = zoneinfo.ZoneInfo("Australia/Lord_Howe")
CHATHAM = zoneinfo.ZoneInfo("Pacific/Chatham")

# each exclusion's example: an expression and a start (UTC) where the difference shows
GAP_EXAMPLE = ("30 * * * *", BERLIN, dt.datetime(2026, 3, 29, 0, 45, tzinfo=UTC))  # 02:30 never is
# Lord Howe 2028-10-01: 02:00 (+10:30) -> 02:30 (+11); 02:43 +11 exists and matches
HALF_HOUR_EXAMPLE = ("43 * * * *", LORD_HOWE, dt.datetime(2028, 9, 30, 15, 16, tzinfo=UTC))
SECOND_PASS_EXAMPLE = ("15,45 2 * * *", BERLIN, dt.datetime(2026, 10, 25, 1, 10, tzinfo=UTC))  # 02:10 CET
# Chatham 2026-04-05: 03:45 (+13:45) -> 02:45 (+12:45); the start is 03:38:45 +13:45
BACK_AT_45_EXAMPLE = ("* */3 * * *", CHATHAM, dt.datetime(2026, 4, 4, 13, 53, 45, tzinfo=UTC))


def cronsim_fires(example: tuple[str, zoneinfo.ZoneInfo, dt.datetime], count: int) -> list[dt.datetime]:
    text, tz, start = example
    return [t.astimezone(UTC) for t in itertools.islice(CronSim(text, start.astimezone(tz)), count)]


def _probe_cronsim() -> dict[int, bool]:
    """Which exclusions the installed cronsim still needs, each read off its own example."""
    gap = cronsim_fires(GAP_EXAMPLE, 1)
    half_hour = cronsim_fires(HALF_HOUR_EXAMPLE, 1)
    second_pass = cronsim_fires(SECOND_PASS_EXAMPLE, 1)
    back_at_45 = cronsim_fires(BACK_AT_45_EXAMPLE, 8)
    return {
        1: gap[0] != dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # skips the gap's 02:30
        2: half_hour[0] != dt.datetime(2028, 9, 30, 15, 43, tzinfo=UTC),  # misses 02:43 +11
        3: second_pass[0] <= SECOND_PASS_EXAMPLE[2]
           or any(later <= earlier for earlier, later in itertools.pairwise(back_at_45)),
        4: set(CronSim("0 5-5/2 * * *", dt.datetime(2026, 1, 1)).hours) != {5},
    }


CRONSIM_DIFFERS = _probe_cronsim()

# zones with daylight saving, and years in which they have it
ZONES = {
    "Europe/Berlin": (2025, 2028),
    "America/New_York": (2025, 2028),
    "Australia/Lord_Howe": (2025, 2028),  # a 30-minute shift
    "America/Santiago": (2025, 2028),  # at midnight; southern hemisphere
    "Pacific/Chatham": (2025, 2028),  # at 02:45/03:45
    "America/Havana": (2025, 2028),  # gap at midnight, repeats 00:00-00:59
    "America/Sao_Paulo": (2016, 2018),  # gap at midnight
    "Africa/Casablanca": (2025, 2028),  # one hour back during Ramadan
    "Antarctica/Troll": (2025, 2028),  # a 2-hour shift
    "Pacific/Apia": (2010, 2012),  # a gap at midnight; 2011-12-30 never happened
}


@cache
def transitions(zone: str) -> tuple[dt.datetime, ...]:
    """The instants (UTC, to the second) at which the zone's offset changes in its years."""
    tz = zoneinfo.ZoneInfo(zone)
    first_year, last_year = ZONES[zone]
    step = dt.timedelta(hours=6)  # no zone changes its offset twice within 6 hours
    t, end = dt.datetime(first_year, 1, 1, tzinfo=UTC), dt.datetime(last_year + 1, 1, 1, tzinfo=UTC)
    found, offset = [], t.astimezone(tz).utcoffset()
    while t < end:
        if (t + step).astimezone(tz).utcoffset() != offset:
            low, high = t, t + step
            while high - low > dt.timedelta(seconds=1):
                middle = low + (high - low) / 2
                low, high = (middle, high) if middle.astimezone(tz).utcoffset() == offset else (low, middle)
            found.append(high.replace(microsecond=0))
            offset = (t + step).astimezone(tz).utcoffset()
        t += step
    return tuple(found)


def field(low: int, high: int, likely: list[int]) -> st.SearchStrategy[str]:
    value = st.one_of(st.sampled_from(likely), st.integers(low, high))
    steps = st.integers(1, high)

    @st.composite
    def item(draw) -> str:
        first = draw(value)
        kind = draw(st.sampled_from(["one", "range", "range-step", "start-step"]))
        if kind == "one":
            return str(first)
        if kind == "start-step":
            return f"{first}/{draw(steps)}"
        one_value_step = kind == "range-step" and CRONSIM_DIFFERS[4]  # exclusion 4: none written
        first = min(first, high - 1) if one_value_step else first
        last = draw(st.integers(first + one_value_step, high))
        return f"{first}-{last}" + (f"/{draw(steps)}" if kind == "range-step" else "")

    return st.one_of(
        st.just("*"),
        st.sampled_from([1, 2, 3, 5, 7, 10, 15, 20, 30, 45]).map(lambda s: f"*/{s}"),
        st.lists(item(), min_size=1, max_size=3).map(",".join),
    )


MINUTES = field(0, 59, [0, 15, 29, 30, 44, 45, 59])
HOURS = field(0, 23, [0, 1, 2, 3, 4, 23])  # where transitions happen
DAYS_OF_MONTH = st.one_of(
    st.just("*"),
    st.sampled_from(["L", "LW", "1,L", "15,LW", "L,LW", "*/2"]),
    field(1, 31, [1, 24, 25, 26, 27, 28, 29, 30, 31]),
)
MONTHS = st.one_of(st.just("*"), field(1, 12, [3, 4, 9, 10, 11]))
WEEKDAY = st.integers(0, 7)  # cronsim reads digits only before L and #: no names here
NTH_WEEKDAY = st.tuples(WEEKDAY, st.integers(1, 5)).map(lambda d: f"{d[0]}#{d[1]}")
DAYS_OF_WEEK = st.one_of(
    st.just("*"),
    WEEKDAY.map(lambda d: f"{d}L"),
    NTH_WEEKDAY,
    st.tuples(WEEKDAY, NTH_WEEKDAY).map(lambda d: f"{d[0]}L,{d[1]}"),
    field(0, 7, [0, 6, 7]),
)
# day fields mostly '*', so that most examples fire on the transition's day
EXPRESSIONS = st.tuples(
    MINUTES,
    HOURS,
    st.one_of(st.just("*"), DAYS_OF_MONTH),
    st.one_of(st.just("*"), MONTHS),
    st.one_of(st.just("*"), DAYS_OF_WEEK),
).map(" ".join)


@st.composite
def starts(draw) -> tuple[str, dt.datetime]:
    zone = draw(st.sampled_from(sorted(ZONES)))
    transition = draw(st.sampled_from(transitions(zone)))
    near = st.integers(-3 * 3600, 3 * 3600)
    day_before = st.integers(-26 * 3600, 3 * 3600)  # daily times before the transition's night
    seconds = draw(st.one_of(near, day_before))
    microseconds = draw(st.sampled_from([0, 1, 999_999]))
    return zone, transition + dt.timedelta(seconds=seconds, microseconds=microseconds)


def wall_matches(oracle: CronSim, local: dt.datetime) -> bool:
    """Whether cronsim's own field matchers accept this local time (exclusions 1 and 2)."""
    return (
        local.month in oracle.months
        and oracle.match_day(local.date())
        and local.hour in oracle.hours
        and local.minute in oracle.minutes
    )


def skipped_before(instant: dt.datetime, tz: zoneinfo.ZoneInfo) -> list[dt.datetime]:
    """The wall minutes the clocks skipped just before `instant`: none unless it ends a gap."""
    jump = instant.astimezone(tz).utcoffset() - (instant - dt.timedelta(seconds=1)).astimezone(tz).utcoffset()
    end = instant.astimezone(tz).replace(tzinfo=None)
    return [end - jump + dt.timedelta(minutes=m) for m in range(jump // dt.timedelta(minutes=1))]


def check_against_cronsim(text: str, zone: str, start: dt.datetime) -> bool:
    """Whether the fires compare (False: cronsim found too few to compare); fails on a difference."""
    tz = zoneinfo.ZoneInfo(zone)
    start_local = start.astimezone(tz)
    try:
        ours = CronExpression.parse(text)
    except InvalidInput:
        # we refuse a syntactically valid expression only when it never fires
        with pytest.raises((CronSimError, StopIteration)):
            next(CronSim(text, start_local))
        return True
    oracle = CronSim(text, start_local)
    theirs = [t.astimezone(UTC) for t in itertools.islice(oracle, FIRES)]
    if len(theirs) < FIRES:
        return False  # cronsim gives up after 50 years without a fire; we do not

    if CRONSIM_DIFFERS[3]:
        kept: list[dt.datetime] = []
        for t in theirs:
            if t <= start and not kept:
                continue
            if kept and t <= kept[-1]:
                break
            kept.append(t)
        theirs = kept
    assert all(t > start for t in theirs) and theirs == sorted(set(theirs)), "cronsim went back in time"

    window_end = max(theirs, default=start)
    fires, after = [], start
    while (after := ours.next_after(after, tz)) <= window_end:
        fires.append(after)
        assert len(fires) < 200
    assert fires == sorted(set(fires))

    missing = [t for t in theirs if t not in fires]
    assert not missing, f"cronsim fires {[t.astimezone(tz) for t in missing]}, we do not"
    for extra in (t for t in fires if t not in theirs):
        local = extra.astimezone(tz)
        assert ours.interval_like, f"we fire {local}, cronsim does not (named wall times)"
        skipped = skipped_before(extra, tz)
        if CRONSIM_DIFFERS[1] and skipped and not wall_matches(oracle, local):
            assert any(wall_matches(oracle, wall) for wall in skipped), f"{local}: nothing matched in the gap"
            continue
        # exclusion 2: a real instant whose local time matches, missed by cronsim after a transition
        assert CRONSIM_DIFFERS[2], f"we fire {local}, cronsim does not"
        assert wall_matches(oracle, local), f"we fire {local}, which does not match"
        # cronsim steps from the top of the hour of its previous time (or of the start)
        hour_before = max((t for t in theirs if t < extra), default=start) - dt.timedelta(hours=1)
        assert any(hour_before < transition <= extra for transition in transitions(zone)), (
            f"we fire {local}, cronsim does not, and no transition came just before"
        )
    return True


# The same 300 examples in every CI run (derandomize), so a quirk of cronsim not met yet cannot turn
# a run red by chance; to look for new differences, run this file with derandomize=False and many
# more examples (about 55,000 found only the four exclusions above when it was written).
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=EXPRESSIONS, zone_and_start=starts())
def test_fire_times_match_cronsim_but_for_the_documented_differences(text, zone_and_start):
    zone, start = zone_and_start
    assume(check_against_cronsim(text, zone, start))


# ------------------------------------------------- each exclusion, once, by example: our side alone


def our_fires(example: tuple[str, zoneinfo.ZoneInfo, dt.datetime], count: int) -> list[str]:
    text, tz, after = example
    expr, fires = CronExpression.parse(text), []
    for _ in range(count):
        after = expr.next_after(after, tz)
        fires.append(after.astimezone(tz).strftime("%d %H:%M%z"))
    return fires


def test_our_side_of_exclusion_1_an_interval_like_time_in_the_gap_fires_when_the_clocks_jump():
    assert our_fires(GAP_EXAMPLE, 2) == ["29 03:00+0200", "29 03:30+0200"]


def test_our_side_of_exclusion_2_the_first_matching_minute_after_a_half_hour_shift_fires():
    assert our_fires(HALF_HOUR_EXAMPLE, 2) == ["01 02:43+1100", "01 03:43+1100"]


def test_our_side_of_exclusion_3_nothing_before_the_start_and_the_second_pass_in_order():
    # from 02:10 CET in the second pass, the 02:15/02:45 of the first pass are past: the next night
    assert our_fires(SECOND_PASS_EXAMPLE, 2) == ["26 02:15+0100", "26 02:45+0100"]
    assert our_fires(BACK_AT_45_EXAMPLE, 8) == [
        "05 03:39+1345", "05 03:40+1345", "05 03:41+1345", "05 03:42+1345", "05 03:43+1345",
        "05 03:44+1345", "05 03:00+1245", "05 03:01+1245",  # 03:00-03:44 come round again
    ]


def test_our_side_of_exclusion_4_a_one_value_range_with_a_step_is_that_value():
    assert set(CronExpression.parse("0 5-5/2 * * *").hours) == {5}
    assert set(CronExpression.parse("0 5-7/5 * * *").hours) == {5}


@pytest.mark.parametrize("example", [GAP_EXAMPLE, HALF_HOUR_EXAMPLE, SECOND_PASS_EXAMPLE, BACK_AT_45_EXAMPLE],
                         ids=["gap", "half-hour", "second-pass", "back-at-45"])
def test_each_exclusion_s_example_compares_with_the_installed_cronsim(example):
    text, tz, start = example
    assert check_against_cronsim(text, tz.key, start)


@pytest.mark.parametrize(
    "text, zone, start",
    [
        ("*/15 * * * *", "Europe/Berlin", dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC)),  # the night
        ("0 * * * *", "Europe/Berlin", dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC)),
        ("30 2 * * *", "Europe/Berlin", dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC)),
        ("0 0 * * 5L", "America/Santiago", dt.datetime(2026, 4, 1, tzinfo=UTC)),
        ("0 0 LW * MON#1", "America/Havana", dt.datetime(2026, 3, 1, tzinfo=UTC)),
        ("*/30 * L * *", "Pacific/Chatham", dt.datetime(2026, 4, 4, 12, 0, tzinfo=UTC)),
    ],
)
def test_chosen_nights_agree_with_cronsim(text, zone, start):
    assert check_against_cronsim(text, zone, start)

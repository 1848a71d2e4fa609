"""Cron schedules: parse a 5-field expression and compute its next fire instant in an IANA zone.

skiplock's scheduler calls `CronExpression.next_after` to decide when a schedule fires next. We
evaluate cron ourselves (not croniter) so that daylight-saving behaviour is exactly ours, and
the same as Vixie cron's where cron defines one:

* an expression whose minute or hour field starts with `*` (`*/15 * * * *`, `0 * * * *`) is
  *interval-like*: it fires at every instant whose local time matches, so through both passes
  of a fall-back hour;
* any other expression names wall times (`30 2 * * *`, `0 9-17 * * *`): a wall time that occurs
  twice (fall-back) fires once, at its first occurrence;
* either way, a wall time that does not exist (spring-forward gap) fires once, at the first
  valid minute after the gap (Vixie cron skips an interval-like job's times in the gap).

Day fields also take `L` (last day of the month), `LW` (its last weekday, Monday to Friday),
`5L` (the month's last Friday) and `MON#1` (its first Monday).

This module is pure calendar arithmetic: it must not read the clock, touch the database or
depend on anything outside the standard library.
"""

from __future__ import annotations

import calendar
import datetime as dt
import zoneinfo
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from .errors import InvalidInput

_ONE_MINUTE = dt.timedelta(minutes=1)
# The Gregorian calendar (weekdays included) repeats every 400 years, so a day pattern that
# matches nothing in 400 years never matches, and one that matches does so within any 401 years.
_CALENDAR_CYCLE_YEARS = 400

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {name.upper(): i for i, name in enumerate(calendar.month_abbr) if name}
_WEEKDAY_NAMES = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: Mapping[str, int] = field(default_factory=dict)


# day-of-week allows 7 as a second Sunday (as Vixie cron does); values are folded to 0 after expansion
_FIELDS = (
    _FieldSpec("minute", 0, 59),
    _FieldSpec("hour", 0, 23),
    _FieldSpec("day-of-month", 1, 31),
    _FieldSpec("month", 1, 12, _MONTH_NAMES),
    _FieldSpec("day-of-week", 0, 7, _WEEKDAY_NAMES),
)


@dataclass(frozen=True)
class CronExpression:
    """A parsed schedule; build it with `parse`, which rejects expressions that never fire."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: tuple[int, ...]
    months: frozenset[int]
    days_of_week: frozenset[int]  # 0 = Sunday
    # Vixie cron: when both day fields are restricted, a day matching either one fires
    day_fields_are_alternatives: bool
    last_day_of_month: bool = False  # L
    last_weekday_of_month: bool = False  # LW: the last Monday-Friday
    last_weekdays: frozenset[int] = frozenset()  # 5L: the month's last Friday
    nth_weekdays: frozenset[tuple[int, int]] = frozenset()  # (1, 1) = MON#1: its first Monday
    # Vixie cron's rule: a minute or hour field starting with '*' fires through a repeated hour
    interval_like: bool = False

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        if not isinstance(text, str):
            raise InvalidInput(f"cron {text!r}: expected a string, got {type(text).__name__}")
        normalized = " ".join(text.split())
        fields = normalized.split(" ") if normalized else []
        if normalized.startswith("@"):
            fields = _expand_alias(normalized)
        elif len(fields) != 5:
            raise InvalidInput(
                f"cron '{normalized}': expected 5 fields (minute hour day-of-month month day-of-week)"
                " or an alias like @hourly"
            )
        minute, hour, day_of_month, month, day_of_week = fields
        days_of_month, month_ends = _parse_day_of_month(day_of_month, normalized)
        days_of_week, last_weekdays, nth_weekdays = _parse_day_of_week(day_of_week, normalized)
        expression = cls(
            text=normalized,
            minutes=tuple(sorted(_parse_field(minute, _FIELDS[0], normalized))),
            hours=tuple(sorted(_parse_field(hour, _FIELDS[1], normalized))),
            days_of_month=tuple(sorted(days_of_month)),
            months=frozenset(_parse_field(month, _FIELDS[3], normalized)),
            days_of_week=frozenset(days_of_week),
            day_fields_are_alternatives=not day_of_month.startswith("*") and not day_of_week.startswith("*"),
            last_day_of_month="L" in month_ends,
            last_weekday_of_month="LW" in month_ends,
            last_weekdays=frozenset(last_weekdays),
            nth_weekdays=frozenset(nth_weekdays),
            interval_like=minute.startswith("*") or hour.startswith("*"),
        )
        if next(expression._matching_days(dt.date(2000, 1, 1), _CALENDAR_CYCLE_YEARS), None) is None:
            raise InvalidInput(
                f"cron '{normalized}': never fires (no date has day-of-month {fields[2]}"
                f" in month {fields[3]} with day-of-week {fields[4]})"
            )
        return expression

    def next_after(self, after: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
        """The first fire instant strictly after `after`, in UTC."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError(f"after must be timezone-aware, got naive {after.isoformat()}")
        # Compare instants in UTC: aware datetimes sharing one tzinfo compare by wall clock and
        # ignore fold, which would confuse the two passes through a fall-back hour.
        after_utc = after.astimezone(dt.timezone.utc)
        local = after_utc.astimezone(tz)
        wall = local.replace(tzinfo=None, second=0, microsecond=0, fold=0)
        first_pass = self._first_fire_after(wall + _ONE_MINUTE, after_utc, tz, fold=0)
        if not self.interval_like:
            return first_pass
        # The second pass through a repeated hour fires too. Mapping each wall time to its later
        # occurrence keeps the order of instants, so one more search in wall order finds it. From
        # inside the first pass, the wall times already passed come round again: start from
        # `repeat` earlier (the length of the repeated stretch; zero outside one).
        repeat = _wall_time_to_utc(wall, tz, fold=1) - _wall_time_to_utc(wall, tz, fold=0)
        start = wall - repeat if local.fold == 0 else wall + _ONE_MINUTE
        return min(first_pass, self._first_fire_after(start, after_utc, tz, fold=1))

    def _first_fire_after(
        self, wall: dt.datetime, after_utc: dt.datetime, tz: zoneinfo.ZoneInfo, fold: int
    ) -> dt.datetime:
        """The first matching wall time from `wall` on whose occurrence `fold` is after `after_utc`."""
        while True:
            wall = self._next_matching_wall_minute(wall)
            instant = _wall_time_to_utc(wall, tz, fold)
            # Skips wall times already passed: in the second pass of a fall-back hour, the first
            # occurrence of its wall times is in the past.
            if instant > after_utc:
                return instant
            wall += _ONE_MINUTE

    def _next_matching_wall_minute(self, start: dt.datetime) -> dt.datetime:
        for day in self._matching_days(start.date(), _CALENDAR_CYCLE_YEARS + 1):
            if day == start.date():
                time_of_day = self._first_time_at_or_after(start.hour, start.minute)
                if time_of_day is None:
                    continue
            else:
                time_of_day = (self.hours[0], self.minutes[0])
            return dt.datetime.combine(day, dt.time(*time_of_day))
        raise ValueError(f"cron '{self.text}': no fire time after {start.isoformat()} before year 10000")

    def _first_time_at_or_after(self, hour: int, minute: int) -> tuple[int, int] | None:
        index = bisect_left(self.hours, hour)
        if index < len(self.hours) and self.hours[index] == hour:
            minute_index = bisect_left(self.minutes, minute)
            if minute_index < len(self.minutes):
                return hour, self.minutes[minute_index]
            index += 1
        if index < len(self.hours):
            return self.hours[index], self.minutes[0]
        return None

    def _matching_days(self, first: dt.date, years: int) -> Iterator[dt.date]:
        """Matching dates from `first` on, for `years` years, skipping whole months that cannot match."""
        year, month, from_day = first.year, first.month, first.day
        for _ in range(years * 12):
            if month in self.months:
                days_in_month = calendar.monthrange(year, month)[1]
                if self.day_fields_are_alternatives:
                    candidates: Iterable[int] = range(from_day, days_in_month + 1)
                else:
                    candidates = sorted(
                        d for d in self._days_of_month_in(year, month, days_in_month) if d >= from_day
                    )
                for day in candidates:
                    date = dt.date(year, month, day)
                    if self._day_matches(date, days_in_month):
                        yield date
            from_day, month = 1, month + 1
            if month > 12:
                year, month = year + 1, 1
                if year > dt.MAXYEAR:
                    return

    def _days_of_month_in(self, year: int, month: int, days_in_month: int) -> set[int]:
        days = {d for d in self.days_of_month if d <= days_in_month}
        if self.last_day_of_month:
            days.add(days_in_month)
        if self.last_weekday_of_month:
            days.add(_last_weekday(year, month, days_in_month))
        return days

    def _day_matches(self, date: dt.date, days_in_month: int) -> bool:
        dom_matches = (
            date.day in self.days_of_month
            or (self.last_day_of_month and date.day == days_in_month)
            or (self.last_weekday_of_month and date.day == _last_weekday(date.year, date.month, days_in_month))
        )
        weekday = date.isoweekday() % 7
        dow_matches = (
            weekday in self.days_of_week
            or (weekday in self.last_weekdays and date.day + 7 > days_in_month)
            or (weekday, (date.day + 6) // 7) in self.nth_weekdays
        )
        if self.day_fields_are_alternatives:
            return dom_matches or dow_matches
        return dom_matches and dow_matches


def _last_weekday(year: int, month: int, days_in_month: int) -> int:
    """The day of the month's last Monday-Friday."""
    weekend_days_at_the_end = max(0, dt.date(year, month, days_in_month).isoweekday() - 5)  # Sat 1, Sun 2
    return days_in_month - weekend_days_at_the_end


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str):
        raise InvalidInput(f"timezone {name!r}: expected a string naming an IANA time zone")
    try:
        return zoneinfo.ZoneInfo(name)
    # ValueError: empty, absolute or escaping paths, not a TZif file; OSError: a directory like 'Europe'
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"timezone '{name}': unknown IANA time zone") from None


def _wall_time_to_utc(wall: dt.datetime, tz: zoneinfo.ZoneInfo, fold: int = 0) -> dt.datetime:
    """The instant of a local wall minute: its first (fold 0) or second (fold 1) occurrence if
    ambiguous, the only one if not, the end of the gap if missing."""
    if _exists(wall, tz):
        return wall.replace(tzinfo=tz, fold=fold).astimezone(dt.timezone.utc)
    # The wall time falls in a spring-forward gap (the round trip landed elsewhere). It fires at
    # the first wall minute that exists, i.e. the moment the clocks jumped. Gaps last at most a day.
    probe = wall + _ONE_MINUTE
    while not _exists(probe, tz):
        probe += _ONE_MINUTE
    return probe.replace(tzinfo=tz).astimezone(dt.timezone.utc)


def _exists(wall: dt.datetime, tz: zoneinfo.ZoneInfo) -> bool:
    # naive comparison ignores fold, so a wall time of the second fall-back pass still counts
    round_trip = wall.replace(tzinfo=tz, fold=0).astimezone(dt.timezone.utc).astimezone(tz)
    return round_trip.replace(tzinfo=None) == wall


def _expand_alias(normalized: str) -> list[str]:
    alias = normalized.lower()
    if " " in alias:
        raise InvalidInput(f"cron '{normalized}': an alias like @hourly stands alone, without fields")
    if alias == "@reboot":
        raise InvalidInput(
            f"cron '{normalized}': @reboot is not supported (schedules fire at times, not at startup)"
        )
    if alias not in _ALIASES:
        raise InvalidInput(f"cron '{normalized}': unknown alias (expected one of {', '.join(_ALIASES)})")
    return _ALIASES[alias].split(" ")


def _parse_field(raw: str, spec: _FieldSpec, text: str) -> set[int]:
    values: set[int] = set()
    for item in _items(raw, spec, text):
        values.update(_parse_item(item, spec, text))
    return values


def _parse_day_of_month(raw: str, text: str) -> tuple[set[int], set[str]]:
    """The plain days, and which of L (last day) and LW (last weekday) the field names."""
    spec = _FIELDS[2]
    days: set[int] = set()
    month_ends: set[str] = set()
    for item in _items(raw, spec, text):
        letters = item.upper()
        if letters in ("L", "LW"):
            month_ends.add(letters)
        elif "L" in letters or "W" in letters:
            raise InvalidInput(f"cron '{text}': day-of-month '{item}' is not a number, L (last day)"
                               " or LW (last weekday)")
        else:
            days.update(_parse_item(item, spec, text))
    return days, month_ends


def _parse_day_of_week(raw: str, text: str) -> tuple[set[int], set[int], set[tuple[int, int]]]:
    """The plain weekdays (0 = Sunday), the `5L` ones (last in the month) and the `MON#1` ones."""
    spec = _FIELDS[4]
    days: set[int] = set()
    last: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in _items(raw, spec, text):
        day_text, has_week, week_text = item.partition("#")
        if has_week:
            if not (week_text.isascii() and week_text.isdigit() and 1 <= int(week_text) <= 5):
                raise InvalidInput(f"cron '{text}': day-of-week '{item}': the week after # must be 1-5")
            nth.add((_single_weekday(day_text, item, text), int(week_text)))
        elif item.upper().endswith("L"):
            last.add(_single_weekday(item[:-1], item, text))
        else:
            days.update(day % 7 for day in _parse_item(item, spec, text))
    return days, last, nth


def _single_weekday(token: str, item: str, text: str) -> int:
    if not token:
        raise InvalidInput(f"cron '{text}': day-of-week '{item}' needs a day first, like 5L or MON#1")
    if not token.isalnum():
        raise InvalidInput(f"cron '{text}': day-of-week '{item}': L and # follow one day, like 5L or MON#1")
    return _parse_value(token, item, _FIELDS[4], text) % 7


def _items(raw: str, spec: _FieldSpec, text: str) -> list[str]:
    items = raw.split(",")
    if not all(items):
        raise InvalidInput(f"cron '{text}': {spec.name} '{raw}' has an empty list item")
    return items


def _parse_item(item: str, spec: _FieldSpec, text: str) -> range:
    base, has_step, step_text = item.partition("/")
    step = 1
    if has_step:
        if not (step_text.isascii() and step_text.isdigit()):
            raise InvalidInput(f"cron '{text}': {spec.name} step '{step_text}' is not a number")
        step = int(step_text)
        if step < 1:
            raise InvalidInput(f"cron '{text}': {spec.name} step {step} must be at least 1")
    if base == "*":
        low, high = spec.low, spec.high
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _parse_value(first, item, spec, text), _parse_value(last, item, spec, text)
        if low > high:
            raise InvalidInput(f"cron '{text}': {spec.name} range {base} is backwards ({low} > {high})")
    else:
        low = _parse_value(base, item, spec, text)
        high = spec.high if has_step else low  # `n/s` means n-max/s
    return range(low, high + 1, step)


def _parse_value(token: str, item: str, spec: _FieldSpec, text: str) -> int:
    if token.isascii() and token.isdigit():
        value = int(token)
        if not spec.low <= value <= spec.high:
            raise InvalidInput(f"cron '{text}': {spec.name} {value} out of range {spec.low}-{spec.high}")
        return value
    if token.upper() in spec.names:
        return spec.names[token.upper()]
    if not token:
        raise InvalidInput(f"cron '{text}': {spec.name} '{item}' is incomplete")
    expected = "a number"
    if spec.names:
        names = list(spec.names)
        expected += f" or a name {names[0]}-{names[-1]}"
    if spec.name not in ("day-of-month", "day-of-week") and ("L" in token.upper() or "#" in token):
        expected += " (L and # belong in day-of-month and day-of-week)"
    raise InvalidInput(f"cron '{text}': {spec.name} '{token}' is not {expected}")

"""Cron schedules: parse a 5-field expression and compute its next fire instant in an IANA zone.

skiplock's scheduler calls `CronExpression.next_after` to decide when a schedule fires next. We
evaluate cron ourselves (not croniter) so that daylight-saving behaviour is exactly ours:

* a wall time that does not exist (spring-forward gap) fires once, at the first valid minute after
  the gap;
* a wall time that occurs twice (fall-back) fires once, at its first occurrence.

This module is pure calendar arithmetic: it must not read the clock, touch the database or
depend on anything outside the standard library.
"""

from __future__ import annotations

import calendar
import datetime as dt
import zoneinfo
from bisect import bisect_left
from collections.abc import Iterator, Mapping
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
        values = [_parse_field(raw, spec, normalized) for raw, spec in zip(fields, _FIELDS)]
        expression = cls(
            text=normalized,
            minutes=tuple(sorted(values[0])),
            hours=tuple(sorted(values[1])),
            days_of_month=tuple(sorted(values[2])),
            months=frozenset(values[3]),
            days_of_week=frozenset(day % 7 for day in values[4]),
            day_fields_are_alternatives=not fields[2].startswith("*") and not fields[4].startswith("*"),
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
        local = after_utc.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0, fold=0)
        candidate = local + _ONE_MINUTE
        while True:
            wall = self._next_matching_wall_minute(candidate)
            instant = _wall_time_to_utc(wall, tz)
            # Skips wall times already passed: in the second pass of a fall-back hour their first
            # occurrence is in the past, so they do not fire again.
            if instant > after_utc:
                return instant
            candidate = wall + _ONE_MINUTE

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
                    candidates = range(from_day, days_in_month + 1)
                else:
                    candidates = [d for d in self.days_of_month if from_day <= d <= days_in_month]
                for day in candidates:
                    date = dt.date(year, month, day)
                    if self._day_matches(date):
                        yield date
            from_day, month = 1, month + 1
            if month > 12:
                year, month = year + 1, 1
                if year > dt.MAXYEAR:
                    return

    def _day_matches(self, date: dt.date) -> bool:
        dom_matches = date.day in self.days_of_month
        dow_matches = date.isoweekday() % 7 in self.days_of_week
        if self.day_fields_are_alternatives:
            return dom_matches or dow_matches
        return dom_matches and dow_matches


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str):
        raise InvalidInput(f"timezone {name!r}: expected a string naming an IANA time zone")
    try:
        return zoneinfo.ZoneInfo(name)
    # ValueError: empty, absolute or escaping paths, not a TZif file; OSError: a directory like 'Europe'
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"timezone '{name}': unknown IANA time zone") from None


def _wall_time_to_utc(wall: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The instant of a local wall minute: first occurrence if ambiguous, end of the gap if missing."""
    # fold=0 picks the first occurrence of an ambiguous wall time (the pre-transition offset).
    if _exists(wall, tz):
        return wall.replace(tzinfo=tz, fold=0).astimezone(dt.timezone.utc)
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
    for item in raw.split(","):
        if not item:
            raise InvalidInput(f"cron '{text}': {spec.name} '{raw}' has an empty list item")
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
        values.update(range(low, high + 1, step))
    return values


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
    raise InvalidInput(f"cron '{text}': {spec.name} '{token}' is not {expected}")

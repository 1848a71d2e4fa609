"""Schedules: the validated definition of a cron or interval schedule, and the pure decisions of
a scheduler tick (which nominal fire times are due, which fire, which are skipped, buffered or
missed). No database access here: scheduler/firing.py applies a `TickPlan` through the store.

Terms: a *nominal* time is when a fire is due by the definition; the task it enqueues carries an
idempotency key derived from (schedule name, nominal time), so one nominal time is one task.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from .cron import CronExpression, parse_timezone
from .definition_files import load_definitions
from .errors import InvalidInput
from .model import encode_payload
from .payload_types import payload_for_enqueue
from .settings import NAME_RE

OVERLAP_POLICIES = ("skip", "allow", "buffer_one", "cancel_previous")
CATCHUP_POLICIES = ("one", "all", "none")
ACTIVE_STATES = ("queued", "running", "cancelling")
# catch-up 'all' fires at most this many missed times per tick; the rest stay due for the next
FIRES_PER_TICK = 100

_FIELDS = ("name", "kind", "queue", "payload", "priority", "max_attempts", "cron", "timezone",
           "interval_seconds", "overlap", "catchup", "catchup_window_seconds", "jitter_seconds", "enabled")


def _number(field: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{field} {value!r}: must be a number of seconds")
    if positive and value <= 0:
        raise InvalidInput(f"{field} {value!r}: must be > 0")
    if value < 0:
        raise InvalidInput(f"{field} {value!r}: must be >= 0")
    return float(value)


def _choice(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidInput(f"{field} {value!r}: must be one of {', '.join(allowed)}")
    return value


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A validated schedule definition. Build it with `Schedule.from_mapping()` (files, API) or
    directly; either way `__post_init__` refuses bad values with the field and the value."""

    name: str
    kind: str
    queue: str = "default"
    payload: Any = dataclasses.field(default_factory=dict)
    priority: int = 0
    max_attempts: int | None = None
    cron: str | None = None
    timezone: str = "UTC"
    interval_seconds: float | None = None
    overlap: str = "skip"
    catchup: str = "one"
    catchup_window_seconds: float = 3600.0
    jitter_seconds: float = 0.0
    enabled: bool = True

    def __post_init__(self) -> None:
        for field in ("name", "kind", "queue"):
            value = getattr(self, field)
            if not isinstance(value, str) or not NAME_RE.fullmatch(value):
                raise InvalidInput(f"{field} {value!r}: use 1-64 letters, digits, '_', '.', ':' or '-', "
                                   "starting with a letter or digit")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) \
                or not -32768 <= self.priority <= 32767:
            raise InvalidInput(f"priority {self.priority!r}: must be an integer in [-32768, 32767]")
        if self.max_attempts is not None and (isinstance(self.max_attempts, bool)
                                              or not isinstance(self.max_attempts, int) or self.max_attempts < 1):
            raise InvalidInput(f"max_attempts {self.max_attempts!r}: must be a positive integer")
        if not isinstance(self.payload, dict):
            raise InvalidInput(f"payload {self.payload!r}: must be a JSON object")
        try:
            json.dumps(self.payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"payload: not JSON-serializable ({exc})") from None
        if (self.cron is None) == (self.interval_seconds is None):
            raise InvalidInput("give exactly one of cron and interval_seconds "
                               f"(cron={self.cron!r}, interval_seconds={self.interval_seconds!r})")
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise InvalidInput(f"cron {self.cron!r}: must be a string like '0 6 * * *' or '@hourly'")
            object.__setattr__(self, "cron", CronExpression.parse(self.cron).text)
        else:
            object.__setattr__(self, "interval_seconds", _number("interval_seconds", self.interval_seconds,
                                                                 positive=True))
        if not isinstance(self.timezone, str):
            raise InvalidInput(f"timezone {self.timezone!r}: must be an IANA time zone name like Europe/Berlin")
        parse_timezone(self.timezone)
        _choice("overlap", self.overlap, OVERLAP_POLICIES)
        _choice("catchup", self.catchup, CATCHUP_POLICIES)
        object.__setattr__(self, "catchup_window_seconds",
                           _number("catchup_window_seconds", self.catchup_window_seconds, positive=True))
        object.__setattr__(self, "jitter_seconds", _number("jitter_seconds", self.jitter_seconds))
        if not isinstance(self.enabled, bool):
            raise InvalidInput(f"enabled {self.enabled!r}: must be true or false")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Schedule":
        """From a YAML/JSON object: unknown fields are refused, not ignored (a typo like `cronn`
        would otherwise leave a schedule that never fires)."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"a schedule must be a mapping of fields, not {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(_FIELDS))
        if unknown:
            raise InvalidInput(f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                               f"(known: {', '.join(_FIELDS)})")
        for required in ("name", "kind"):
            if required not in data:
                raise InvalidInput(f"{required}: required")
        values = dict(data)
        if values.get("payload") is None:
            values.pop("payload", None)
        if "interval_seconds" in values and isinstance(values["interval_seconds"], str):
            raise InvalidInput(f"interval_seconds {values['interval_seconds']!r}: must be a number of seconds")
        schedule = cls(**values)
        # a kind whose payload model this process imported (@task(payload=...)): refused when the
        # definition is saved, not at its first fire, and kept in the model's JSON form, as an
        # enqueue stores it. Here, not in __post_init__: a schedule read back from the database
        # is shown and fired as stored, whatever its model says now.
        payload = payload_for_enqueue(schedule.kind, schedule.payload)
        return schedule if payload is schedule.payload else dataclasses.replace(schedule, payload=payload)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---- fire times -------------------------------------------------------------------------

    @property
    def tz(self) -> ZoneInfo:
        return parse_timezone(self.timezone)

    @property
    def describe(self) -> str:
        if self.cron is not None:
            return f"cron '{self.cron}' ({self.timezone})"
        return f"every {self.interval_seconds:g}s"

    def first_fire(self, now: dt.datetime) -> dt.datetime:
        """The first nominal time of a new (or re-timed, or resumed) schedule."""
        if self.cron is not None:
            return CronExpression.parse(self.cron).next_after(now, self.tz)
        return now + dt.timedelta(seconds=self.interval_seconds)

    def fire_after(self, nominal: dt.datetime) -> dt.datetime:
        """The nominal time that follows `nominal`."""
        if self.cron is not None:
            return CronExpression.parse(self.cron).next_after(nominal, self.tz)
        return nominal + dt.timedelta(seconds=self.interval_seconds)

    def next_fires(self, now: dt.datetime, count: int) -> list[dt.datetime]:
        """The `count` nominal times a schedule created (or re-timed) at `now` would fire at."""
        fires = [self.first_fire(now)]
        while len(fires) < count:
            fires.append(self.fire_after(fires[-1]))
        return fires

    def current_tick(self, next_fire_at: dt.datetime, now: dt.datetime) -> dt.datetime:
        """The nominal time a "fire now" at `now` fires under: a cron schedule's current minute,
        an interval schedule's latest time on its own grid (next_fire_at give or take whole
        intervals) at or before now. Its idempotency key is the one the scheduler uses, so firing
        twice in one minute or tick, or firing by hand a time the scheduler fires too, is one task."""
        if self.cron is not None:
            return now.replace(second=0, microsecond=0)
        step = dt.timedelta(seconds=self.interval_seconds)
        return next_fire_at + ((now - next_fire_at) // step) * step

    def due(self, next_fire_at: dt.datetime, now: dt.datetime) -> "Due":
        """The nominal times due at `now`, after the catch-up policy, and the next fire."""
        if next_fire_at > now:
            return Due([], next_fire_at)
        second = self.fire_after(next_fire_at)
        if second > now:  # the usual case: exactly one time is due
            return Due([next_fire_at], second)
        # more than one time is due: the schedulers were down (or far behind)
        if self.catchup == "all":
            return self._due_all(next_fire_at, now)
        latest, count = self._latest_due(second, now)
        following = self.fire_after(latest)
        if self.catchup == "one":
            return Due([latest], following, missed=count - 1, missed_at=None,
                       detail=f"one fire for {count} due times (catchup one)")
        return Due([], following, missed=count, missed_at=latest,
                   detail=f"{count} due times dropped (catchup none)")

    def _due_all(self, next_fire_at: dt.datetime, now: dt.datetime) -> "Due":
        horizon = now - dt.timedelta(seconds=self.catchup_window_seconds)
        missed, missed_at, t = 0, None, next_fire_at
        if t < horizon:  # older than the window: dropped
            if self.interval_seconds is not None:
                step = dt.timedelta(seconds=self.interval_seconds)
                k = math.ceil((horizon - t) / step)
                missed, missed_at, t = k, t + (k - 1) * step, t + k * step
            else:
                missed_at, t = t, self.fire_after(horizon - dt.timedelta(microseconds=1))
                missed = None  # counting every dropped cron time could take long; not needed
        times = []
        while t <= now and len(times) < FIRES_PER_TICK:
            times.append(t)
            t = self.fire_after(t)
        detail = None
        if missed_at is not None:
            count = "some" if missed is None else str(missed)
            detail = f"{count} due times older than the catch-up window dropped (catchup all)"
        return Due(times, t, missed=missed or 0, missed_at=missed_at, detail=detail)

    def _latest_due(self, second: dt.datetime, now: dt.datetime) -> tuple[dt.datetime, int]:
        """The last due time and how many are due, given that `second` (the second due) is."""
        if self.interval_seconds is not None:
            step = dt.timedelta(seconds=self.interval_seconds)
            k = (now - second) // step
            return second + k * step, k + 2
        t, count = second, 2
        if now - second > dt.timedelta(days=2):
            # long downtime: start near `now` instead of walking every missed minute
            probe = self.fire_after(now - dt.timedelta(days=1))
            if probe <= now:
                t, count = probe, count + 1
        while (following := self.fire_after(t)) <= now:
            t, count = following, count + 1
        return t, count


@dataclasses.dataclass(frozen=True)
class ScheduleStatus:
    """A stored schedule: its definition and the scheduler's bookkeeping."""

    schedule: Schedule
    next_fire_at: dt.datetime
    buffered_fire_at: dt.datetime | None
    last_fire_at: dt.datetime | None
    last_task_id: Any
    fires: int
    skips: int
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclasses.dataclass
class Due:
    times: list[dt.datetime]
    next_fire_at: dt.datetime
    missed: int = 0
    missed_at: dt.datetime | None = None  # the nominal time a 'missed' record is written under
    detail: str | None = None


@dataclasses.dataclass(frozen=True)
class Fire:
    nominal_at: dt.datetime
    cancel_previous: bool = False  # cancel the previous fire's task first (overlap cancel_previous)
    detail: str | None = None


@dataclasses.dataclass
class TickPlan:
    """What one tick does to one schedule: the fires, the records of everything decided, and
    the row's new next_fire_at/buffered_fire_at."""

    fires: list[Fire]
    records: list[tuple[dt.datetime, str, str | None]]  # (nominal_at, outcome, detail), not fires
    next_fire_at: dt.datetime
    buffered_fire_at: dt.datetime | None
    skips: int = 0


def plan_tick(schedule: Schedule, *, next_fire_at: dt.datetime, buffered_fire_at: dt.datetime | None,
              previous_state: str | None, now: dt.datetime) -> TickPlan:
    """Decide one tick for one schedule row (held locked by the caller)."""
    active = previous_state in ACTIVE_STATES
    fires: list[Fire] = []
    records: list[tuple[dt.datetime, str, str | None]] = []
    skips = 0
    if buffered_fire_at is not None and not active:
        fires.append(Fire(buffered_fire_at, detail="buffered until the previous fire finished"))
        buffered_fire_at, active = None, True
    due = schedule.due(next_fire_at, now)
    if due.missed_at is not None:
        records.append((due.missed_at, "missed", due.detail))
    for nominal in due.times:
        detail = due.detail if due.missed_at is None else None
        if not active or schedule.overlap == "allow":
            fires.append(Fire(nominal, detail=detail))
        elif schedule.overlap == "cancel_previous":
            fires.append(Fire(nominal, cancel_previous=True, detail=detail))
        elif schedule.overlap == "buffer_one" and buffered_fire_at is None:
            buffered_fire_at = nominal
            records.append((nominal, "buffered", "waiting for the previous fire's task to finish"))
        else:
            reason = ("a fire is already buffered" if schedule.overlap == "buffer_one"
                      else "the previous fire's task is still queued or running")
            records.append((nominal, "skipped", reason))
            skips += 1
        active = True
    return TickPlan(fires, records, due.next_fire_at, buffered_fire_at, skips)


def idempotency_key(name: str, nominal_at: dt.datetime) -> str:
    """The key of the task fired for (schedule, nominal time): a second decision about the same
    time finds the first task instead of making another."""
    return f"schedule:{name}:{nominal_at.astimezone(dt.timezone.utc).isoformat(timespec='microseconds')}"


def load_file(path: str, source: str = "-f") -> list[Schedule]:
    """Schedules from a YAML (or JSON) file: a list, or a mapping with a `schedules` list.
    Errors name the file, the entry and the field; nothing is applied unless all are valid."""
    return load_definitions(path, source, "schedules", "name", Schedule.from_mapping)


def check_schedule_payloads(schedules: "Sequence[Schedule]", max_bytes: int) -> None:
    """Refuse, naming the schedule, a payload the enqueue limit would refuse: at apply time
    (and in a dry run), not at every fire."""
    for s in schedules:
        try:
            encode_payload(s.payload, max_bytes)
        except InvalidInput as exc:
            raise type(exc)(f"schedule {s.name!r}: {exc}") from None

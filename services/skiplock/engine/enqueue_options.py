"""The enqueue options that may turn an enqueue into an existing task: `Unique` (a unique window)
and `Debounce`. Pure data, validated when built; the statements that enforce them are
engine/sql/unique.sql's (migration 0021's indexes), run by engine/store/unique_inserts.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Collection
from typing import Any

from .errors import InvalidInput
from .states import CANCELLING, QUEUED, RUNNING, STATES, WAITING

# A task in flight always blocks its duplicates: the worker's own transitions (claim, retry,
# step, suspend, reclaim) move a task between these, and none of them may meet a unique key taken
# by another task. The choice a caller makes is which finished states block too.
IN_FLIGHT = (WAITING, QUEUED, RUNNING, CANCELLING)
UNIQUE_DEFAULT_STATES = IN_FLIGHT
MAX_KEY_NAMES = 32
MAX_DEBOUNCE_KEY = 255
MAX_SECONDS = 10 * 365 * 86400.0


def _seconds(name: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0) or value > MAX_SECONDS:
        bound = "> 0" if positive else ">= 0"
        raise InvalidInput(f"{name} {value!r}: must be a number of seconds {bound} and at most {MAX_SECONDS:.0f}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Unique:
    """enqueue(..., unique=Unique(...)): at most one task of this kind and queue (and, with
    `by_payload`, this payload) in `states` at a time; an enqueue that finds one returns its id
    (created False) and writes nothing.

    by_payload: False (kind and queue only), True (the whole payload), or payload key names (those
    keys' values; a missing key counts as absent). period: seconds; the key holds within one fixed
    window of the database's clock (windows counted from the Unix epoch, as River counts them), so
    a duplicate in the next window is a new task. None: no window, unique while a blocking task
    exists. states: where a task blocks its duplicates: always waiting, queued, running and
    cancelling (the default); add completed (no second run in the window once one succeeded),
    failed (none after a final failure) or cancelled (none after a cancel).
    """

    by_payload: bool | Collection[str] = False
    period: float | None = None
    states: Collection[str] = UNIQUE_DEFAULT_STATES

    def __post_init__(self) -> None:
        by = self.by_payload
        if not isinstance(by, bool):
            if isinstance(by, (str, bytes)) or not isinstance(by, Collection) or not by \
                    or not all(isinstance(k, str) and k for k in by) or len(by) > MAX_KEY_NAMES:
                raise InvalidInput(f"unique by_payload {by!r}: must be true, false or a list of 1-{MAX_KEY_NAMES} "
                                   "payload key names")
            object.__setattr__(self, "by_payload", tuple(sorted(set(by))))
        if self.period is not None:
            object.__setattr__(self, "period", _seconds("unique period", self.period, positive=True))
        states = self.states
        if isinstance(states, (str, bytes)) or not isinstance(states, Collection):
            raise InvalidInput(f"unique states {states!r}: must be a list of task states")
        unknown = [s for s in states if s not in STATES]
        if unknown:
            raise InvalidInput(f"unique states: {unknown[0]!r} is not a task state ({', '.join(STATES)})")
        missing = [s for s in IN_FLIGHT if s not in states]
        if missing:
            raise InvalidInput(f"unique states must include {', '.join(IN_FLIGHT)} (a task in flight always "
                               f"blocks its duplicates); missing: {', '.join(missing)}")
        object.__setattr__(self, "states", tuple(s for s in STATES if s in states))

    def digest(self, kind: str, queue: str, payload: Any) -> str:
        """The key's digest (without the window): the same for two enqueues that are duplicates."""
        if self.by_payload is True:
            part: Any = {} if payload is None else payload
        elif self.by_payload:
            source = payload if isinstance(payload, dict) else {}
            part = {k: source[k] for k in self.by_payload if k in source}
        else:
            part = None
        text = json.dumps([kind, queue, self.period, self.by_payload, part], sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def state_list(self) -> str:
        return ",".join(self.states)


@dataclasses.dataclass(frozen=True)
class Debounce:
    """enqueue(..., debounce=Debounce(key, delay, max_wait)): while a task of this kind, queue and
    key is queued and has not started, an enqueue replaces its payload (and priority, max_attempts)
    and moves its start to now + `delay` seconds, never past its first enqueue + `max_wait`
    (None: no bound, a steady stream postpones it for as long as it lasts). Once it started, the
    next enqueue makes a new task."""

    key: str
    delay: float
    max_wait: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not 1 <= len(self.key) <= MAX_DEBOUNCE_KEY or "\x00" in self.key:
            raise InvalidInput(f"debounce key {self.key!r}: must be a string of 1-{MAX_DEBOUNCE_KEY} characters "
                               "without NUL")
        object.__setattr__(self, "delay", _seconds("debounce delay", self.delay, positive=False))
        if self.max_wait is not None:
            wait = _seconds("debounce max_wait", self.max_wait, positive=True)
            if wait < self.delay:
                raise InvalidInput(f"debounce max_wait {wait:g}: must be >= delay ({self.delay:g})")
            object.__setattr__(self, "max_wait", wait)


def check_options(unique: Any, debounce: Any, *, idempotency_key: Any, delay: Any, run_at: Any,
                  depends_on: Any) -> None:
    """InvalidInput for an option of the wrong type or a combination that means nothing."""
    if unique is not None and not isinstance(unique, Unique):
        raise InvalidInput(f"unique {unique!r}: must be a skiplock.Unique(...)")
    if debounce is not None and not isinstance(debounce, Debounce):
        raise InvalidInput(f"debounce {debounce!r}: must be a skiplock.Debounce(...)")
    if unique is not None and debounce is not None:
        raise InvalidInput("give unique or debounce, not both (a debounced task is already the only one of its key)")
    if (unique is not None or debounce is not None) and depends_on:
        raise InvalidInput(f"{'unique' if unique is not None else 'debounce'} does not combine with depends_on")
    if debounce is not None:
        if idempotency_key is not None:
            raise InvalidInput("debounce does not combine with an idempotency key: a debounced enqueue merges into "
                               "the task that waits, so repeating it is already safe")
        if delay is not None or run_at is not None:
            raise InvalidInput("debounce sets the start itself (its delay): give no delay or run_at")


def unique_from(fields: dict | None) -> Unique | None:
    """A Unique from the API's `unique` object (or the CLI's --unique-* options): by_payload (true:
    the whole payload), payload_keys (those keys; not with by_payload), period, states."""
    if fields is None:
        return None
    keys, whole = fields.get("payload_keys"), fields.get("by_payload", False)
    if keys is not None and whole:
        raise InvalidInput("unique: give by_payload or payload_keys, not both")
    states = fields.get("states")
    return Unique(by_payload=tuple(keys) if keys is not None else bool(whole), period=fields.get("period"),
                  states=UNIQUE_DEFAULT_STATES if states is None else tuple(states))


def debounce_from(fields: dict | None) -> Debounce | None:
    """A Debounce from the API's `debounce` object (or the CLI's --debounce-* options)."""
    if fields is None:
        return None
    return Debounce(key=fields["key"], delay=fields["delay"], max_wait=fields.get("max_wait"))

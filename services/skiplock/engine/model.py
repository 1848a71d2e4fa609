"""The vocabulary of skiplock: task states, claimed tasks, handler outcomes, task definitions,
and the app-generated UUIDv7 ids. Pure data: no I/O here.
"""

from __future__ import annotations

import dataclasses
import functools
import datetime as dt
import inspect
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

QUEUED, RUNNING, CANCELLING = "queued", "running", "cancelling"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
STATES = (QUEUED, RUNNING, CANCELLING, COMPLETED, FAILED, CANCELLED)
FINISHED_STATES = (COMPLETED, FAILED, CANCELLED)


class _UUID7:
    """UUIDv7 (RFC 9562): 48-bit Unix ms, then a 12-bit counter seeded at random each ms so ids
    made by one process sort in creation order, then 62 random bits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> uuid.UUID:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._last_ms:
                self._last_ms = ms
                self._counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
            else:
                self._counter += 1
                if self._counter > 0xFFF:  # more than ~2k ids in one ms: borrow the next ms
                    self._last_ms += 1
                    self._counter = 0
                ms = self._last_ms
            counter = self._counter
        rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
        return uuid.UUID(int=value)

    def many(self, n: int) -> list[uuid.UUID]:
        """n ids in one go (bulk enqueue): one clock read and one call for the random bits."""
        entropy = struct.unpack(f">{n}Q", os.urandom(8 * n))
        ids = []
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._last_ms:
                counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
            else:
                ms, counter = self._last_ms, self._counter + 1
            for i in range(n):
                if counter > 0xFFF:
                    ms, counter = ms + 1, 0
                ids.append(uuid.UUID(int=(ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64
                                     | 0b10 << 62 | entropy[i] & ((1 << 62) - 1)))
                counter += 1
            self._last_ms, self._counter = ms, counter - 1
        return ids


uuid7 = _UUID7()


# ---- handler outcomes ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Step:
    """Returned by a handler: save a checkpoint and run the task again (after `delay` seconds),
    with `ctx.cursor == cursor`. A saved step resets the attempt count."""

    cursor: Any = None
    progress: float | None = None
    message: str | None = None
    delay: float = 0.0


class Retry(Exception):
    """Raised by a handler: try again after `delay` seconds (default: the kind's backoff).
    Counts an attempt."""

    def __init__(self, delay: float | None = None, message: str = "retry requested"):
        super().__init__(message)
        self.delay = delay


class Fail(Exception):
    """Raised by a handler: the task is failed at once, without retry (a permanent error)."""


# ---- task definitions ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, a cap, and an optional total deadline (seconds from
    the task's creation after which no retry is scheduled)."""

    base: float = 2.0
    cap: float = 900.0
    deadline: float | None = None


@dataclasses.dataclass(frozen=True)
class TaskDef:
    kind: str
    fn: Callable[..., Any]
    queue: str = "default"
    max_attempts: int = 3
    timeout: float | None = None
    retry: RetryPolicy = RetryPolicy()

    @functools.cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


class ClaimedTask(NamedTuple):
    """A task as its claim returned it: what a worker needs to run it and to fence its writes.
    (Immutable like the dataclasses here, but a tuple: built per claimed row on the hot path.)"""

    id: uuid.UUID
    kind: str
    queue: str
    payload: Any
    attempt: int
    lease_token: int
    cursor: Any
    waited_seconds: float


@dataclasses.dataclass(frozen=True)
class Task:
    """A task row as stored."""

    id: uuid.UUID
    kind: str
    queue: str
    priority: int
    payload: Any
    state: str
    attempts: int
    max_attempts: int | None
    reclaims: int
    lease_token: int | None
    lease_owner: str | None
    lease_until: dt.datetime | None
    run_after: dt.datetime
    deadline: dt.datetime | None
    idempotency_key: str | None
    cursor: Any
    progress: float | None
    message: str | None
    result: Any
    last_error: str | None
    event_seq: int
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    # read with one task (task_get), not in lists: from the event that set last_error
    last_error_traceback: str | None = None


@dataclasses.dataclass(frozen=True)
class TaskEvent:
    task_id: uuid.UUID
    seq: int
    type: str
    at: dt.datetime
    lease_token: int | None
    attempt: int | None
    data: Any


class Settlement(NamedTuple):
    """One fenced write that ends, checkpoints or gives back a claim (see task_settle).
    A tuple for the same reason as ClaimedTask: one per finished task."""

    task_id: uuid.UUID
    lease_token: int
    outcome: str  # completed | failed | retry | step | released
    result: Any = None
    error: str | None = None
    delay: float | None = None
    cursor: Any = None
    progress: float | None = None
    message: str | None = None
    deadline_seconds: float | None = None
    kind_max_attempts: int | None = None
    traceback: str | None = None  # the handler's, bounded (worker/tracebacks.py): kept in the event


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One row of the API's audit log."""

    id: int
    at: dt.datetime
    actor: str
    action: str
    target: str | None
    request_id: str | None
    outcome: str
    detail: Any

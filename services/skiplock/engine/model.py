"""The vocabulary of skiplock: task states (engine/states.py's), claimed tasks, handler outcomes,
task definitions, tasks to enqueue (validated, payload encoded); the app-generated UUIDv7 ids are
engine/ids.py's. Pure data: no I/O here.
"""

from __future__ import annotations

import dataclasses
import functools
import datetime as dt
import inspect
import json
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from .errors import InvalidInput, PayloadTooLarge
from .enqueue_options import Debounce, Unique, check_options
from .ids import uuid7  # noqa: F401 - model.uuid7 is what the rest of the code imports
from .states import (CANCELLED, CANCELLING, COMPLETED, FAILED, FINISHED_STATES, QUEUED, RUNNING,  # noqa: F401
                     STATES, WAITING)  # model's names, as the rest of the code imports them
from .settings import check_name
from .tracing import current_carrier

# what a failed or cancelled parent does to its dependent (enqueue's on_parent_failure)
ON_PARENT_FAILURE = ("cancel", "run")
# the most parents one task may have
MAX_PARENTS = 10_000




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


class TooManyChildren(Fail):
    """Raised by ctx.enqueue past SKIPLOCK_MAX_CHILDREN_PER_RUN: another run would ask for as many,
    so the task fails at once, and its transaction, children included, is rolled back."""


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
    limited: bool = False  # claimed under a limit (task_claim_limited): its outcome frees room
    trace_context: Any = None  # the enqueuer's W3C trace context (engine/tracing.py), or None


class Parent(NamedTuple):
    """A parent of a task, as its handler reads it (ctx.parents())."""

    id: uuid.UUID
    kind: str
    state: str
    result: Any
    error: str | None


class Claim(list):
    """What one claim statement did: the tasks it leased (the list itself), and what it saw of
    limited work. A list, so that a caller who wants only the tasks reads it as one."""

    __slots__ = ("parked", "limited_work", "wake_in", "crowded")

    def __init__(self, tasks=(), *, parked: int = 0, limited_work: bool = False, wake_in: float | None = None,
                 crowded: int = 0):
        super().__init__(tasks)
        self.parked = parked              # tasks of limited kinds it parked instead (task_claim)
        self.limited_work = limited_work  # a group of parked tasks may have work (task_claim)
        self.wake_in = wake_in            # seconds until a throttled group's bucket has a token (task_claim_limited)
        self.crowded = crowded            # queues left out: every claim lane was taken (task_claim)


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
    concurrency_key: str = ""  # '' = none: the kind's one group without a key (flow control)
    waiting_on: int = 0  # parents not final yet (a 'waiting' task's)
    on_parent_failure: str = "cancel"  # what a failed or cancelled parent does to it (ON_PARENT_FAILURE)
    # a suspended task's (state 'waiting'; durable execution): sleep | signal | tasks, when it
    # wakes on its own, the signal that wakes it sooner. NULL for a dependent of depends_on.
    suspended: str | None = None
    wake_at: dt.datetime | None = None
    awaited_signal: str | None = None
    # read with one task (task_get), not in lists: from the event that set last_error
    last_error_traceback: str | None = None


class StepRecord(NamedTuple):
    """One recorded call of a handler (durable execution): a step, or a wait as it began."""

    position: int  # its place in the run, from 1
    name: str
    occurrence: int  # 1 for the name's first call in a run, 2 for the next ("email"#2), ...
    type: str  # step | sleep | signal | tasks
    result: Any
    lease_token: int  # the run that recorded it
    attempt: int
    recorded_at: dt.datetime


class Signal(NamedTuple):
    """A signal as sent (skiplock.send_signal): the first send of a name wins."""

    name: str
    payload: Any
    sent_at: dt.datetime


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
    # completed | failed | retry | step | released | suspend; step_record: a step's record was
    # refused by its fence (the claim was lost), and nothing is written
    outcome: str
    result: Any = None
    error: str | None = None
    delay: float | None = None
    cursor: Any = None
    progress: float | None = None
    message: str | None = None
    deadline_seconds: float | None = None
    kind_max_attempts: int | None = None
    traceback: str | None = None  # the handler's, bounded (worker/tracebacks.py): kept in the event
    # a suspension's (outcome 'suspend', durable execution): why, until when, for which signal,
    # how many awaited tasks are not final, and whether what it waits for is there already
    suspended: str | None = None
    wake_at: str | None = None  # ISO 8601, the database's clock
    awaited_signal: str | None = None
    waiting_on_add: int | None = None
    ready: bool | None = None
    # the claim's queue: on the distributed placement a settle is routed by it (store/routed.py)
    queue: str | None = None


# What task_settle and task_heartbeat answer for a claim whose row another transaction held: they
# never wait for a row lock (another worker's claim statement can hold one for a moment), so the
# write did not happen and is made again.
BUSY = "busy"


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


# ---- tasks to enqueue -------------------------------------------------------------------------

class TaskSpec:
    """One task to enqueue, validated on construction."""

    __slots__ = ("kind", "payload", "queue", "priority", "max_attempts", "delay", "run_at",
                 "idempotency_key", "payload_json", "max_payload_bytes", "concurrency_key", "depends_on",
                 "on_parent_failure", "trace_context", "unique", "debounce")

    def __init__(self, kind: str, payload: Any = None, *, queue: str = "default", priority: int = 0,
                 run_at: dt.datetime | None = None, delay: float | None = None,
                 idempotency_key: str | None = None, max_attempts: int | None = None,
                 max_payload_bytes: int = 1024 * 1024, concurrency_key: str | None = None,
                 depends_on: Any = None, on_parent_failure: str = "cancel", unique: Unique | None = None,
                 debounce: Debounce | None = None):
        check_name("task kind", kind)
        check_name("queue", queue)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -32768 <= priority <= 32767:
            raise InvalidInput(f"priority {priority!r}: must be an integer in [-32768, 32767]")
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                         or max_attempts < 1):
            raise InvalidInput(f"max_attempts {max_attempts!r}: must be a positive integer")
        if run_at is not None and delay is not None:
            raise InvalidInput("give either run_at or delay, not both")
        if run_at is not None and (not isinstance(run_at, dt.datetime) or run_at.tzinfo is None):
            raise InvalidInput(f"run_at {run_at!r}: must be a timezone-aware datetime")
        if delay is not None:
            if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not delay >= 0:
                raise InvalidInput(f"delay {delay!r}: must be a number of seconds >= 0")
        _check_key(idempotency_key)
        self.concurrency_key = concurrency_key_of(concurrency_key)
        self.depends_on = parent_ids(depends_on)
        if on_parent_failure not in ON_PARENT_FAILURE:
            raise InvalidInput(f"on_parent_failure {on_parent_failure!r}: must be 'cancel' or 'run'")
        self.on_parent_failure = on_parent_failure
        if unique is not None or debounce is not None:
            check_options(unique, debounce, idempotency_key=idempotency_key, delay=delay, run_at=run_at,
                          depends_on=self.depends_on)
        self.unique, self.debounce = unique, debounce
        self.kind, self.queue, self.priority = kind, queue, priority
        self.max_attempts, self.delay, self.run_at = max_attempts, delay, run_at
        self.idempotency_key = idempotency_key
        self.payload, self.payload_json = payload, encode_payload(payload, max_payload_bytes)
        self.max_payload_bytes = max_payload_bytes
        self.trace_context = current_carrier()

    def with_payload(self, payload: Any, idempotency_key: str | None = None,
                     concurrency_key: str | None = None) -> "TaskSpec":
        """Another task like this one (bulk enqueue validates the shared fields once); a
        `concurrency_key` given here replaces this one's."""
        _check_key(idempotency_key)
        if idempotency_key is not None and self.debounce is not None:
            check_options(None, self.debounce, idempotency_key=idempotency_key, delay=None, run_at=None,
                          depends_on=())
        spec = object.__new__(TaskSpec)
        spec.unique, spec.debounce = self.unique, self.debounce
        spec.concurrency_key = self.concurrency_key if concurrency_key is None else concurrency_key_of(concurrency_key)
        spec.depends_on, spec.on_parent_failure = self.depends_on, self.on_parent_failure
        spec.kind, spec.queue, spec.priority = self.kind, self.queue, self.priority
        spec.max_attempts, spec.delay, spec.run_at = self.max_attempts, self.delay, self.run_at
        spec.max_payload_bytes, spec.trace_context = self.max_payload_bytes, self.trace_context
        spec.idempotency_key = idempotency_key
        spec.payload, spec.payload_json = payload, encode_payload(payload, self.max_payload_bytes)
        return spec


# One encoder for every payload: json.dumps() with options builds a new encoder per call.
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# ... and JSONEncoder.encode() still builds its C encoder per call (most of the cost of a small
# payload), so build that once, where the C accelerator exists. Without the circular-reference
# markers, it holds no state between calls (safe to share between threads); a circular payload
# ends in RecursionError instead of ValueError.
_JSON_C = (json.encoder.c_make_encoder(None, _JSON.default, json.encoder.encode_basestring_ascii, None,
                                       _JSON.key_separator, _JSON.item_separator, False, False, False)
           if json.encoder.c_make_encoder is not None else None)


def _dumps(value: Any) -> str:
    if _JSON_C is None:
        return _JSON.encode(value)
    return "".join(_JSON_C(value, 0))


MAX_CONCURRENCY_KEY_BYTES = 256


def parent_ids(depends_on: Any) -> tuple[uuid.UUID, ...]:
    """enqueue's depends_on as task ids, in order, without repeats; () for none."""
    if depends_on is None:
        return ()
    if isinstance(depends_on, (str, bytes, uuid.UUID)) or not hasattr(depends_on, "__iter__"):
        raise InvalidInput("depends_on: must be a list of task ids")
    ids: dict[uuid.UUID, None] = {}
    for value in depends_on:
        try:
            ids[value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))] = None
        except ValueError:
            raise InvalidInput(f"depends_on: {value!r} is not a task id") from None
    if len(ids) > MAX_PARENTS:
        raise InvalidInput(f"depends_on: at most {MAX_PARENTS:,} parents (got {len(ids):,})")
    return tuple(ids)


def concurrency_key_of(key: str | None) -> str:
    """A task's concurrency key as stored: '' for none (the kind's one group without a key)."""
    if key is None:
        return ""
    if not isinstance(key, str):
        raise InvalidInput(f"concurrency_key {key!r}: must be a string")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("concurrency_key: not encodable as UTF-8 (a lone surrogate)") from None
    if size > MAX_CONCURRENCY_KEY_BYTES:
        raise InvalidInput(f"concurrency_key: must be at most {MAX_CONCURRENCY_KEY_BYTES} bytes (got {size})")
    if "\x00" in key:
        raise InvalidInput("concurrency_key contains a NUL character, which Postgres cannot store")
    return key


def _check_key(key: str | None) -> None:
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 255):
        raise InvalidInput("idempotency_key: must be a string of 1-255 characters")


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text, or InvalidInput/PayloadTooLarge saying why not."""
    try:
        encoded = _dumps({} if payload is None else payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload is not JSON-serializable: {exc}") from exc
    except RecursionError:
        raise InvalidInput("payload is not JSON-serializable: it refers to itself, or nests too deep") from None
    if "\\u0000" in encoded:
        raise InvalidInput("payload contains a NUL character (\\u0000), which Postgres jsonb cannot store")
    size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
    if size > max_bytes:
        raise PayloadTooLarge(f"payload is {size} bytes; the limit is {max_bytes} (SKIPLOCK_MAX_PAYLOAD_BYTES)")
    return encoded

"""`@skiplock.task`: declare a handler and get a task handle back.

The handle is still the function (calling it calls the handler, so a handler's unit tests stay
plain calls), and it enqueues its own kind: `send_email.enqueue(conn, payload, **options)`,
`.enqueue_many`, `.enqueue_async`, `.enqueue_many_async`, with the options and semantics of the
module functions (enqueueing.py), the queue defaulting to the one @task declared. The string forms
(`skiplock.enqueue(conn, "emails.send", ...)`) stay as they are.

A type checker reads the payload type from the handler's signature: `def send(ctx, payload: Email)`
gives a `TaskHandle[Email, ...]`, whose enqueue takes an Email (or a mapping, validated at run
time, as the module functions take one). Registering is engine/registry.py's.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

from . import enqueueing
from .engine.enqueue_options import Debounce, Unique
from .engine.errors import InvalidInput
from .engine.ids import TaskId
from .engine.model import RetryPolicy, TaskDef
from .engine.payload_types import TypedTaskDef, check_model
from .engine.registry import REGISTRY, Registry
from .engine.settings import check_name

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .engine.store import AsyncConnection, Connection

P = TypeVar("P")
R = TypeVar("R")


class _Options(TypedDict, total=False):
    """What enqueue and enqueue_many both take (see skiplock.enqueue)."""
    queue: str
    priority: int
    run_at: dt.datetime | None
    delay: float | None
    max_attempts: int | None
    concurrency_key: str | None
    depends_on: Iterable[uuid.UUID | str] | None
    on_parent_failure: str
    unique: Unique | None
    debounce: Debounce | None
    schema: str | None


class EnqueueOptions(_Options, total=False):
    idempotency_key: str | None


class EnqueueManyOptions(_Options, total=False):
    idempotency_keys: Iterable[str | None] | None
    concurrency_keys: Iterable[str | None] | None


class TaskHandle(Generic[P, R]):
    """A declared task: call it as the handler, or enqueue its kind. `kind`, `definition` (the
    TaskDef the worker runs) and `fn` (the handler itself) are attributes."""

    def __init__(self, fn: Callable[[Any, P], R], definition: TaskDef):
        self.fn, self.definition, self.kind = fn, definition, definition.kind
        self.skiplock_kind = definition.kind  # what the bare function carried before handles
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __call__(self, ctx: Any, payload: P) -> R:
        return self.fn(ctx, payload)

    def __repr__(self) -> str:
        return f"<skiplock task {self.kind!r} ({getattr(self.fn, '__qualname__', self.fn)!r})>"

    def _with_queue(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return options if "queue" in options else {**options, "queue": self.definition.queue}  # type: ignore[return-value]

    def enqueue(self, conn_or_url: Connection | str, payload: P | Mapping[str, Any] | None = None,
                **options: Unpack[EnqueueOptions]) -> TaskId:
        """skiplock.enqueue(conn_or_url, self.kind, payload, **options)."""
        return enqueueing.enqueue(conn_or_url, self.kind, payload, **self._with_queue(options))

    def enqueue_many(self, conn_or_url: Connection | str, payloads: Iterable[P | Mapping[str, Any] | None],
                     **options: Unpack[EnqueueManyOptions]) -> list[TaskId]:
        """skiplock.enqueue_many(conn_or_url, self.kind, payloads, **options)."""
        return enqueueing.enqueue_many(conn_or_url, self.kind, payloads, **self._with_queue(options))

    def enqueue_async(self, conn_or_url: AsyncConnection | str, payload: P | Mapping[str, Any] | None = None,
                      **options: Unpack[EnqueueOptions]) -> Awaitable[TaskId]:
        """skiplock.enqueue_async(conn_or_url, self.kind, payload, **options), to await."""
        return enqueueing.enqueue_async(conn_or_url, self.kind, payload, **self._with_queue(options))

    def enqueue_many_async(self, conn_or_url: AsyncConnection | str,
                           payloads: Iterable[P | Mapping[str, Any] | None],
                           **options: Unpack[EnqueueManyOptions]) -> Awaitable[list[TaskId]]:
        """skiplock.enqueue_many_async(conn_or_url, self.kind, payloads, **options), to await."""
        return enqueueing.enqueue_many_async(conn_or_url, self.kind, payloads, **self._with_queue(options))


def task(kind: str, *, queue: str = "default", max_attempts: int = 3, timeout: float | None = None,
         retry_base: float = 2.0, retry_cap: float = 900.0, deadline: float | None = None,
         payload: type | None = None,
         registry: Registry | None = None) -> Callable[[Callable[[Any, P], R]], TaskHandle[P, R]]:
    """Declare a task handler: `fn(ctx, payload)`, sync or `async def`; returns its TaskHandle.

    max_attempts: executions before `failed`; timeout: seconds a run may take (then
    ctx.cancel_requested is set, and the run is abandoned and retried after a grace);
    retry_base/retry_cap: exponential backoff with full jitter, in seconds; deadline: seconds after
    the task's creation past which no retry is scheduled; payload: a pydantic model class: the
    handler receives an instance of it, and payloads are validated at enqueue and at run
    (engine/payload_types.py).
    """
    check_name("task kind", kind)
    check_name("queue", queue)
    if max_attempts < 1:
        raise InvalidInput(f"task {kind}: max_attempts must be >= 1")
    if timeout is not None and timeout <= 0:
        raise InvalidInput(f"task {kind}: timeout must be > 0 seconds")
    if retry_base <= 0 or retry_cap < retry_base:
        raise InvalidInput(f"task {kind}: need 0 < retry_base <= retry_cap")
    if deadline is not None and deadline <= 0:
        raise InvalidInput(f"task {kind}: deadline must be > 0 seconds")
    policy = RetryPolicy(base=retry_base, cap=retry_cap, deadline=deadline)
    options: dict[str, Any] = {"kind": kind, "queue": queue, "max_attempts": max_attempts, "timeout": timeout,
                               "retry": policy}
    define: type[TaskDef] = TaskDef
    if payload is not None:
        options["payload_model"] = check_model(kind, payload)
        define = TypedTaskDef

    def decorate(fn: Callable[[Any, P], R]) -> TaskHandle[P, R]:
        if isinstance(fn, TaskHandle):  # @task over a handle: the handler under it
            fn = fn.fn
        definition = define(fn=fn, **options)
        # `is None`, not `or`: an empty Registry is falsy (it has a length)
        (REGISTRY if registry is None else registry).add(definition)
        return TaskHandle(fn, definition)

    return decorate

"""The handler registry behind `@skiplock.task`: task kinds and how to run them.

Decorating registers the function in the process-wide REGISTRY (the worker imports the modules
named in SKIPLOCK_TASKS and reads it). The function stays callable as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from .errors import ConfigError, InvalidInput
from .model import RetryPolicy, TaskDef
from .settings import check_name


class Registry:
    def __init__(self) -> None:
        self._defs: dict[str, TaskDef] = {}

    def add(self, definition: TaskDef) -> None:
        existing = self._defs.get(definition.kind)
        if existing is not None and existing.fn is not definition.fn:
            same_place = (getattr(existing.fn, "__module__", None), getattr(existing.fn, "__qualname__", None)) == \
                (getattr(definition.fn, "__module__", None), getattr(definition.fn, "__qualname__", None))
            if not same_place:  # a module imported twice (e.g. as __main__) redefines the same kind
                raise InvalidInput(f"task kind {definition.kind!r} is defined twice")
        self._defs[definition.kind] = definition

    def get(self, kind: str) -> TaskDef | None:
        return self._defs.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._defs)

    def __len__(self) -> int:
        return len(self._defs)


REGISTRY = Registry()


def task(kind: str, *, queue: str = "default", max_attempts: int = 3, timeout: float | None = None,
         retry_base: float = 2.0, retry_cap: float = 900.0, deadline: float | None = None,
         registry: Registry | None = None) -> Callable:
    """Declare a task handler: `fn(ctx, payload)`, sync or `async def`.

    max_attempts: executions before `failed`; timeout: seconds a run may take (then
    ctx.cancel_requested is set, and the run is abandoned and retried after a grace);
    retry_base/retry_cap: exponential backoff with full jitter, in seconds; deadline: seconds after
    the task's creation past which no retry is scheduled.
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

    def decorate(fn: Callable) -> Callable:
        (registry or REGISTRY).add(TaskDef(kind=kind, fn=fn, queue=queue, max_attempts=max_attempts,
                                           timeout=timeout, retry=policy))
        fn.skiplock_kind = kind  # type: ignore[attr-defined]
        return fn

    return decorate


def import_task_modules(modules: Iterable[str]) -> None:
    """Import the modules named in SKIPLOCK_TASKS so their @task decorators register."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"SKIPLOCK_TASKS: cannot import {name!r}: {exc}") from exc

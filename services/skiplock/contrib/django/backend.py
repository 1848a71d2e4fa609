"""SkiplockBackend, a django.tasks backend, and SkiplockTask, the Task class it makes.

Enqueue and get_result; what a worker does with the task is running.py's. This module decides
where a Django task goes (kind, queue, priority, run_at, max_attempts, and the database) and
leaves the statements to skiplock.enqueue and the store.

OPTIONS (all optional):
  DATABASE      the alias of the Django database that holds skiplock's tables (default "default"):
                enqueue writes in the transaction of that connection
  DATABASE_URL  instead, a database of skiplock's own (a libpq URL or key=value string): enqueue
                commits the task at once on a short connection of its own, whatever Django's
                transaction then does
  SCHEMA        skiplock's schema (default SKIPLOCK_DB_SCHEMA, else "skiplock")
  MAX_ATTEMPTS  runs before a raising task is failed (default 1: Django's own semantics)
  RETRY_BASE, RETRY_CAP   the backoff between attempts, seconds (exponential, full jitter; 2, 900)
  TIMEOUT       seconds a run may take (default none)
Each of the last four may also be given per task: `@task(max_attempts=5, retry_base=1)`.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks.backends.base import BaseTaskBackend
except ImportError:  # Django < 6 has no task framework
    raise ImproperlyConfigured(f"skiplock.contrib.django needs Django 6 or newer (django.tasks); this is "
                               f"Django {django.get_version()}") from None
from django.db import connections
from django.tasks.base import Task, TaskResult
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json

import skiplock
from skiplock.engine import store as store_mod
from skiplock.engine.errors import SkiplockError
from skiplock.engine.settings import check_name
from skiplock.engine.store.task_reads import task_with_events, task_with_events_async
from skiplock.enqueueing import _schema

from . import results

OPTION_DEFAULTS = {"DATABASE": None, "DATABASE_URL": None, "SCHEMA": None, "MAX_ATTEMPTS": 1,
                   "RETRY_BASE": 2.0, "RETRY_CAP": 900.0, "TIMEOUT": None}
# what SkiplockBackend decides itself: with_options() may not set these
_DECIDED = {"conn_or_url", "kind", "payload", "queue", "priority", "run_at", "max_attempts", "schema"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SkiplockTask(Task):
    """A Django Task with skiplock's per-task options: `@task(max_attempts=5, retry_base=1.0,
    retry_cap=60.0, timeout=30.0)` (None: the backend's OPTIONS), and enqueue options of
    skiplock.enqueue given with `.with_options(idempotency_key=..., concurrency_key=...)`."""

    max_attempts: int | None = None
    retry_base: float | None = None
    retry_cap: float | None = None
    timeout: float | None = None
    enqueue_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        Task.__post_init__(self)  # the backend's validate_task (a slots dataclass: no bare super())
        backend = self.get_backend()
        if isinstance(backend, SkiplockBackend):  # using(backend=...) may name another kind of backend
            backend.register(self)

    def with_options(self, **options) -> "SkiplockTask":
        """This task with skiplock.enqueue's keyword options (idempotency_key, concurrency_key,
        depends_on, on_parent_failure, delay, ...) added to each of its enqueues."""
        allowed = set(inspect.signature(skiplock.enqueue).parameters) - _DECIDED
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise InvalidTask(f"with_options: {', '.join(unknown)} is not an option of skiplock.enqueue "
                              f"(use one of {', '.join(sorted(allowed))})")
        merged = {**dict(self.enqueue_options), **options}
        return dataclasses.replace(self, enqueue_options=tuple(sorted(merged.items())))


class SkiplockBackend(BaseTaskBackend):
    task_class = SkiplockTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTION_DEFAULTS))
        if unknown:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']: unknown option {', '.join(unknown)} (use "
                                     f"{', '.join(OPTION_DEFAULTS)})")
        options = {**OPTION_DEFAULTS, **self.options}
        if options["DATABASE"] is not None and options["DATABASE_URL"] is not None:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']: give DATABASE or DATABASE_URL, not both")
        self.database_url: str | None = options["DATABASE_URL"]
        self.database_alias: str | None = None if self.database_url else (options["DATABASE"] or "default")
        try:
            self.schema = _schema(options["SCHEMA"])
            for queue in self.queues:
                check_name("queue", queue)
            self.defaults = results.RunOptions(max_attempts=options["MAX_ATTEMPTS"], retry_base=options["RETRY_BASE"],
                                               retry_cap=options["RETRY_CAP"], timeout=options["TIMEOUT"])
        except SkiplockError as exc:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]: {exc}") from None
        self._registered: dict[str, tuple] = {}  # kind -> what it was registered with

    # ---- tasks ---------------------------------------------------------------------------------
    def validate_task(self, task):
        super().validate_task(task)
        try:
            check_name("task kind", task.module_path)
            check_name("queue", task.queue_name)
            self.run_options(task)
        except SkiplockError as exc:
            raise InvalidTask(f"{task.module_path}: {exc}") from None

    def run_options(self, task) -> results.RunOptions:
        """The task's retry and timeout options, its own or else the backend's (checked)."""
        own = {f: getattr(task, f, None) for f in ("max_attempts", "retry_base", "retry_cap", "timeout")}
        return dataclasses.replace(self.defaults, **{k: v for k, v in own.items() if v is not None})

    def register(self, task) -> None:
        """Register `task`'s kind as a skiplock handler in this process (the worker runs it),
        once per kind and options: `using()` makes a new Task per call."""
        from .running import register_kind

        key = (task.func, task.takes_context, self.run_options(task))
        if self._registered.get(task.module_path) != key:
            register_kind(task, key[2])
            self._registered[task.module_path] = key

    # ---- enqueue -------------------------------------------------------------------------------
    def _enqueue_arguments(self, task, args, kwargs) -> dict:
        self.validate_task(task)
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):  # USE_TZ = False: the current time zone's
            run_at = timezone.make_aware(run_at)
        return dict(kind=task.module_path, payload={"args": normalize_json(list(args)), "kwargs": normalize_json(kwargs)},
                    queue=task.queue_name, priority=task.priority, run_at=run_at,
                    max_attempts=self.run_options(task).max_attempts, schema=self.schema,
                    **dict(getattr(task, "enqueue_options", ())))

    def _enqueued(self, found) -> TaskResult:
        result = results.task_result(self, *found)
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue(self, task, args, kwargs):
        """The task written, and read back on the same connection: the result is what get_result
        reads (the database's enqueued_at; an idempotency key's existing task as it is)."""
        arguments = self._enqueue_arguments(task, args, kwargs)
        if self.database_url is None:
            conn = self._django_connection()
            return self._enqueued(task_with_events(conn, self.schema, skiplock.enqueue(conn, **arguments)))
        # autocommit: the insert commits as the statement it is, before the read
        with store_mod.connect(self.database_url, autocommit=True) as conn:
            return self._enqueued(task_with_events(conn, self.schema, skiplock.enqueue(conn, **arguments)))

    async def aenqueue(self, task, args, kwargs):
        if self.database_alias is not None:
            # Django's connections are sync: the thread-sensitive call runs on the thread that
            # holds the async code's connection and transaction
            return await super().aenqueue(task, args, kwargs)
        arguments = self._enqueue_arguments(task, args, kwargs)
        async with await store_mod.connect_async(self.database_url, autocommit=True) as conn:
            task_id = await skiplock.enqueue_async(conn, **arguments)
            found = await task_with_events_async(conn, self.schema, task_id)
        return await sync_to_async(self._enqueued)(found)  # task_enqueued's receivers may be sync code

    def _django_connection(self):
        connection = connections[self.database_alias]
        connection.ensure_connection()
        return connection.connection  # a psycopg.Connection, in the atomic block's transaction if any

    # ---- results -------------------------------------------------------------------------------
    def get_result(self, result_id):
        task_id = _task_id(result_id)
        if self.database_url is not None:
            with store_mod.connect(self.database_url, autocommit=True) as conn:
                found = task_with_events(conn, self.schema, task_id)
        else:
            found = task_with_events(self._django_connection(), self.schema, task_id)
        return self._result(result_id, found)

    async def aget_result(self, result_id):
        if self.database_alias is not None:
            return await super().aget_result(result_id)
        task_id = _task_id(result_id)
        async with await store_mod.connect_async(self.database_url, autocommit=True) as conn:
            found = await task_with_events_async(conn, self.schema, task_id)
        return self._result(result_id, found)

    def _result(self, result_id, found) -> TaskResult:
        if found is None:
            raise TaskResultDoesNotExist(f"no task {result_id}")
        return results.task_result(self, *found)


def _task_id(result_id) -> uuid.UUID:
    try:
        return uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(f"no task {result_id!r}: a skiplock task id is a UUID") from None

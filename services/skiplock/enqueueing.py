"""`skiplock.enqueue` and `skiplock.enqueue_many`, and their asyncio twins `enqueue_async` and
`enqueue_many_async`: put tasks in the queue from application code.

Given a psycopg connection (Connection, or AsyncConnection for the async calls), the tasks are
written inside the caller's current transaction (they exist, and wake workers, only if it
commits). Given a URL, a short connection is opened and the tasks are committed before
returning. Both kinds run the same statements (engine/store/task_inserts.py).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

from .engine import migrate as migrations
from .engine import store as store_mod
from .engine.errors import ConfigError, ConnectionLost, InvalidInput, MigrationError
from .engine.settings import SCHEMA_RE, EnvReader, check_pooler
from .engine.enqueue_options import Debounce, Unique
from .engine.ids import TaskId
from .engine.model import TaskSpec
from .engine.payload_types import payload_for_enqueue, payloads_for_enqueue
from .engine.registry import queue_of
from .engine.store import AsyncConnection, Connection



def _schema(schema: str | None) -> str:
    schema = schema or os.environ.get("SKIPLOCK_DB_SCHEMA") or "skiplock"
    if not SCHEMA_RE.fullmatch(schema):
        raise InvalidInput(f"invalid schema name {schema!r}")
    return schema


def _max_payload() -> int:
    """SKIPLOCK_MAX_PAYLOAD_BYTES, parsed like every setting (a bad value is a ConfigError)."""
    limit = EnvReader(os.environ).integer("MAX_PAYLOAD_BYTES", 1024 * 1024)
    if limit < 1:
        raise ConfigError(f"SKIPLOCK_MAX_PAYLOAD_BYTES={limit}: must be >= 1")
    return limit


def _pooler() -> str:
    """SKIPLOCK_DATABASE_POOLER, parsed like every setting: enqueue_many through a transaction
    pooler must not prepare its statement."""
    return check_pooler(EnvReader(os.environ).text("DATABASE_POOLER").lower())


def _insert(conn_or_url, schema: str | None, write: store_mod.TaskWrite) -> list[TaskId]:
    """`write` on the caller's connection, or on a short one of our own, committed."""
    schema = _schema(schema)
    if isinstance(conn_or_url, Connection):
        return store_mod.tasks_write(conn_or_url, write, schema)
    if isinstance(conn_or_url, AsyncConnection):
        raise InvalidInput("enqueue got a psycopg AsyncConnection: use `await skiplock.enqueue_async(...)`")
    if not isinstance(conn_or_url, str):
        raise InvalidInput("enqueue needs a psycopg Connection or a postgresql:// URL")
    with store_mod.connect(conn_or_url, autocommit=False, pooler=_pooler()) as conn:
        ids = store_mod.tasks_write(conn, write, schema)
        try:
            with store_mod.translated_errors(conn):
                conn.commit()
        except ConnectionLost as exc:
            raise _commit_lost(exc) from exc
    return ids


async def _insert_async(conn_or_url, schema: str | None, write: store_mod.TaskWrite) -> list[TaskId]:
    """_insert, for asyncio: the same statements on an AsyncConnection."""
    schema = _schema(schema)
    if isinstance(conn_or_url, AsyncConnection):
        return await store_mod.tasks_write_async(conn_or_url, write, schema)
    if isinstance(conn_or_url, Connection):
        raise InvalidInput("enqueue_async got a psycopg Connection: use `skiplock.enqueue(...)`, or an AsyncConnection")
    if not isinstance(conn_or_url, str):
        raise InvalidInput("enqueue_async needs a psycopg AsyncConnection or a postgresql:// URL")
    async with await store_mod.connect_async(conn_or_url, autocommit=False, pooler=_pooler()) as conn:
        ids = await store_mod.tasks_write_async(conn, write, schema)
        try:
            with store_mod.translated_errors(conn):
                await conn.commit()
        except ConnectionLost as exc:
            raise _commit_lost(exc) from exc
    return ids


def _commit_lost(exc: ConnectionLost) -> ConnectionLost:
    # COMMIT was sent and no answer came: Postgres may have applied it or not
    return ConnectionLost(
        "the connection was lost while committing, so the tasks may or may not be stored: enqueue "
        "again with the same idempotency key (a stored task's key returns its id; a missing one is "
        f"stored); without a key, look before enqueueing again ({' '.join(str(exc).split())})")


def enqueue(conn_or_url: Connection | str, kind: str, payload: Any = None, *,
            queue: str | None = None, priority: int = 0, run_at: dt.datetime | None = None,
            delay: float | None = None, idempotency_key: str | None = None, max_attempts: int | None = None,
            concurrency_key: str | None = None, depends_on: Iterable[uuid.UUID | str] | None = None,
            on_parent_failure: str = "cancel", unique: Unique | None = None, debounce: Debounce | None = None,
            schema: str | None = None) -> TaskId:
    """Enqueue one task and return its id: a TaskId (a UUID) whose `created` is False when it is an
    existing task's (its `idempotency_key` or `unique` key was taken, or `debounce` merged this
    enqueue into the task that waits).

    queue: None (the default) is the queue @task declared for `kind` when this process imported
    its definition, else "default". priority: higher runs first. run_at (aware datetime) or delay (seconds): not before then.
    max_attempts: None uses the kind's (from @task, 3 if not declared).
    concurrency_key: the task's group under its kind's limits (`skiplock limits`); tasks without
    one form one group per kind.
    depends_on: ids of tasks that must be final first; the task waits (state 'waiting') until then.
    A parent already final counts at once. on_parent_failure: 'cancel' (a failed or cancelled
    parent cancels this task) or 'run' (it runs once every parent is final, whatever they ended).
    unique: a skiplock.Unique(by_payload, period, states): at most one such task at a time (see
    Unique). debounce: a skiplock.Debounce(key, delay, max_wait): merge a burst into one run.
    """
    return _counted(_insert(conn_or_url, schema, _one(
        kind, payload, queue=queue, priority=priority, run_at=run_at, delay=delay,
        idempotency_key=idempotency_key, max_attempts=max_attempts, concurrency_key=concurrency_key,
        depends_on=depends_on, on_parent_failure=on_parent_failure, unique=unique, debounce=debounce)), kind,
        unique)[0]


def _one(kind: str, payload: Any, **fields) -> store_mod.TaskWrite:
    payload = payload_for_enqueue(kind, payload)  # a typed kind's validated JSON form
    fields["queue"] = queue_of(kind, fields["queue"])
    return store_mod.TaskWrite(specs=[TaskSpec(kind, payload, max_payload_bytes=_max_payload(), **fields)])


def _counted(ids: list, kind: str, unique: Unique | None) -> list:
    """`ids`, once the unique duplicates among them are counted (skiplock_enqueue_duplicates_total
    on prometheus_client's default registry, which an application exposes with its own metrics)."""
    if unique is not None:
        duplicates = sum(1 for task_id in ids if not task_id.created)
        if duplicates:
            from .engine.metrics import enqueue_duplicates

            enqueue_duplicates().labels(kind).inc(duplicates)
    return ids


def enqueue_many(conn_or_url: Connection | str, kind: str, payloads: Iterable[Any], *,
                 queue: str | None = None, priority: int = 0, run_at: dt.datetime | None = None,
                 delay: float | None = None, idempotency_keys: Iterable[str | None] | None = None,
                 max_attempts: int | None = None, concurrency_key: str | None = None,
                 concurrency_keys: Iterable[str | None] | None = None,
                 depends_on: Iterable[uuid.UUID | str] | None = None, on_parent_failure: str = "cancel",
                 unique: Unique | None = None, debounce: Debounce | None = None,
                 schema: str | None = None) -> list[TaskId]:
    """Enqueue many tasks of one kind in one set-based statement; returns their ids in order.
    Workers get one notification per queue, not one per task. `concurrency_key` applies to
    every task; `concurrency_keys` gives one per payload (None: `concurrency_key`). `depends_on`,
    `on_parent_failure`, `unique` and `debounce` apply to every task (see enqueue): with unique,
    two payloads of one key in the batch make one task; with debounce, each payload merges into
    the task the one before it made or found, so the last one is what runs."""
    write = _many(kind, payloads, queue=queue, priority=priority, run_at=run_at, delay=delay,
                  idempotency_keys=idempotency_keys, max_attempts=max_attempts, concurrency_key=concurrency_key,
                  concurrency_keys=concurrency_keys, depends_on=depends_on, on_parent_failure=on_parent_failure,
                  unique=unique, debounce=debounce)
    return _counted(_insert(conn_or_url, schema, write), kind, unique) if write.template or write.specs else []


async def enqueue_async(conn_or_url: AsyncConnection | str, kind: str, payload: Any = None, *,
                        queue: str | None = None, priority: int = 0, run_at: dt.datetime | None = None,
                        delay: float | None = None, idempotency_key: str | None = None,
                        max_attempts: int | None = None, concurrency_key: str | None = None,
                        depends_on: Iterable[uuid.UUID | str] | None = None, on_parent_failure: str = "cancel",
                        unique: Unique | None = None, debounce: Debounce | None = None,
                        schema: str | None = None) -> TaskId:
    """enqueue() for asyncio: the same arguments, statements, errors and idempotency, on a
    psycopg AsyncConnection (inside its current transaction) or a URL (committed before it
    returns)."""
    return _counted(await _insert_async(conn_or_url, schema, _one(
        kind, payload, queue=queue, priority=priority, run_at=run_at, delay=delay,
        idempotency_key=idempotency_key, max_attempts=max_attempts, concurrency_key=concurrency_key,
        depends_on=depends_on, on_parent_failure=on_parent_failure, unique=unique, debounce=debounce)), kind,
        unique)[0]


async def enqueue_many_async(conn_or_url: AsyncConnection | str, kind: str, payloads: Iterable[Any], *,
                             queue: str | None = None, priority: int = 0, run_at: dt.datetime | None = None,
                             delay: float | None = None, idempotency_keys: Iterable[str | None] | None = None,
                             max_attempts: int | None = None, concurrency_key: str | None = None,
                             concurrency_keys: Iterable[str | None] | None = None,
                             depends_on: Iterable[uuid.UUID | str] | None = None, on_parent_failure: str = "cancel",
                             unique: Unique | None = None, debounce: Debounce | None = None,
                             schema: str | None = None) -> list[TaskId]:
    """enqueue_many() for asyncio (see enqueue_async); with an open transaction, the COPY of a
    large batch runs in a savepoint, as the sync call's does."""
    write = _many(kind, payloads, queue=queue, priority=priority, run_at=run_at, delay=delay,
                  idempotency_keys=idempotency_keys, max_attempts=max_attempts, concurrency_key=concurrency_key,
                  concurrency_keys=concurrency_keys, depends_on=depends_on, on_parent_failure=on_parent_failure,
                  unique=unique, debounce=debounce)
    if not (write.template or write.specs):
        return []
    return _counted(await _insert_async(conn_or_url, schema, write), kind, unique)


def _many(kind: str, payloads: Iterable[Any], *, queue: str | None, priority: int, run_at: dt.datetime | None,
          delay: float | None, idempotency_keys: Iterable[str | None] | None, max_attempts: int | None,
          concurrency_key: str | None, concurrency_keys: Iterable[str | None] | None,
          depends_on: Iterable[uuid.UUID | str] | None, on_parent_failure: str, unique: Unique | None = None,
          debounce: Debounce | None = None) -> store_mod.TaskWrite:
    """enqueue_many's tasks, validated: the COPY path's template and payloads, or specs."""
    queue = queue_of(kind, queue)
    payloads = payloads_for_enqueue(kind, list(payloads))
    keys = list(idempotency_keys) if idempotency_keys is not None else None
    if keys is not None and len(keys) != len(payloads):
        raise InvalidInput("idempotency_keys must have one entry per payload")
    groups = list(concurrency_keys) if concurrency_keys is not None else None
    if groups is not None and len(groups) != len(payloads):
        raise InvalidInput("concurrency_keys must have one entry per payload")
    if not payloads:
        return store_mod.TaskWrite()
    if keys is not None and all(k is None for k in keys):
        keys = None
    if groups is not None and all(g is None for g in groups):
        groups = None
    first = TaskSpec(kind, payloads[0], queue=queue, priority=priority, run_at=run_at, delay=delay,
                     idempotency_key=keys[0] if keys else None, max_attempts=max_attempts,
                     max_payload_bytes=_max_payload(), concurrency_key=concurrency_key,
                     depends_on=depends_on, on_parent_failure=on_parent_failure, unique=unique, debounce=debounce)
    if (len(payloads) >= store_mod.COPY_THRESHOLD and delay is None and run_at is None and keys is None
            and groups is None and not first.depends_on and unique is None and debounce is None):
        # the common case, streamed: each payload is checked as it is written
        return store_mod.TaskWrite(template=first, payloads=payloads)
    # a None in concurrency_keys is concurrency_key: the first spec's, as validated
    base = first
    if groups is not None:
        first = base.with_payload(payloads[0], keys[0] if keys else None, groups[0])
    rest = zip(payloads[1:], keys[1:] if keys else itertools.repeat(None),
               groups[1:] if groups else itertools.repeat(None))
    specs = [first] + [base.with_payload(p, k, g) for p, k, g in rest]
    return store_mod.TaskWrite(specs=specs)


def migrate(url: str, schema: str | None = None) -> list[str]:
    """Apply pending migrations; returns the names applied."""
    return [m.path.name for m in migrations.apply(url, _schema(schema))]

"""`skiplock.enqueue` and `skiplock.enqueue_many`: put tasks in the queue from application code.

Given a psycopg connection, the tasks are written inside the caller's current transaction (they
exist, and wake workers, only if it commits). Given a URL, a short connection is opened and the
tasks are committed before returning.
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
from .engine.model import TaskSpec
from .engine.store import Connection



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


# Enqueue relies on migration 0007: since it, the database writes a task's 'queued' event and
# wakes the workers (the tasks_inserted trigger). Into a schema without it, a task would be stored
# with neither, so enqueue refuses instead. Checked once per database and schema in a process
# (migrations only go forward), in pg_catalog, which every role may read.
_REQUIRED = ("0007", "tasks_inserted")
_schema_ok: set[tuple] = set()
_schema_ok_on: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # connection -> schemas (quicker)


def _require_schema(conn: Connection, schema: str) -> None:
    if schema in _schema_ok_on.get(conn, ()):
        return
    info = conn.info
    key = (info.host, info.port, info.dbname, schema)
    if key in _schema_ok:
        _schema_ok_on.setdefault(conn, set()).add(schema)
        return
    tasks, trigger = conn.execute(
        "SELECT to_regclass(%(tasks)s) IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_trigger "
        "WHERE tgrelid = to_regclass(%(tasks)s) AND tgname = %(trigger)s)",
        {"tasks": f"{schema}.tasks", "trigger": _REQUIRED[1]}).fetchone()
    if not tasks:
        raise MigrationError(f"the skiplock schema is missing (no table {schema}.tasks): run `skiplock migrate`")
    if not trigger:
        raise MigrationError(f"database schema {schema!r} lacks migration {_REQUIRED[0]}, which this version of "
                             "skiplock enqueues into: run `skiplock migrate`, then upgrade the enqueuers")
    _schema_ok.add(key)
    _schema_ok_on.setdefault(conn, set()).add(schema)


def _insert(conn_or_url, schema: str | None, write) -> list[uuid.UUID]:
    """write(conn, schema) on the caller's connection, or on a short one of our own, committed."""
    schema = _schema(schema)
    if isinstance(conn_or_url, Connection):
        with store_mod.translated_errors():
            _require_schema(conn_or_url, schema)
        return write(conn_or_url, schema)
    if not isinstance(conn_or_url, str):
        raise InvalidInput("enqueue needs a psycopg Connection or a postgresql:// URL")
    with store_mod.connect(conn_or_url, autocommit=False, pooler=_pooler()) as conn:
        with store_mod.translated_errors():
            _require_schema(conn, schema)
        ids = write(conn, schema)
        try:
            with store_mod.translated_errors(conn):
                conn.commit()
        except ConnectionLost as exc:
            # COMMIT was sent and no answer came: Postgres may have applied it or not
            raise ConnectionLost(
                "the connection was lost while committing, so the tasks may or may not be stored: enqueue "
                "again with the same idempotency key (a stored task's key returns its id; a missing one is "
                f"stored); without a key, look before enqueueing again ({' '.join(str(exc).split())})") from exc
    return ids


def enqueue(conn_or_url: Connection | str, kind: str, payload: Any = None, *,
            queue: str = "default", priority: int = 0, run_at: dt.datetime | None = None,
            delay: float | None = None, idempotency_key: str | None = None, max_attempts: int | None = None,
            concurrency_key: str | None = None, depends_on: Iterable[uuid.UUID | str] | None = None,
            on_parent_failure: str = "cancel", schema: str | None = None) -> uuid.UUID:
    """Enqueue one task and return its id (the existing task's id when `idempotency_key` is taken).

    priority: higher runs first. run_at (aware datetime) or delay (seconds): not before then.
    max_attempts: None uses the kind's (from @task, 3 if not declared).
    concurrency_key: the task's group under its kind's limits (`skiplock limits`); tasks without
    one form one group per kind.
    depends_on: ids of tasks that must be final first; the task waits (state 'waiting') until then.
    A parent already final counts at once. on_parent_failure: 'cancel' (a failed or cancelled
    parent cancels this task) or 'run' (it runs once every parent is final, whatever they ended).
    """
    spec = TaskSpec(kind, payload, queue=queue, priority=priority, run_at=run_at, delay=delay,
                    idempotency_key=idempotency_key, max_attempts=max_attempts,
                    max_payload_bytes=_max_payload(), concurrency_key=concurrency_key,
                    depends_on=depends_on, on_parent_failure=on_parent_failure)
    return _insert(conn_or_url, schema, lambda conn, schema: store_mod.task_insert(conn, [spec], schema))[0]


def enqueue_many(conn_or_url: Connection | str, kind: str, payloads: Iterable[Any], *,
                 queue: str = "default", priority: int = 0, run_at: dt.datetime | None = None,
                 delay: float | None = None, idempotency_keys: Iterable[str | None] | None = None,
                 max_attempts: int | None = None, concurrency_key: str | None = None,
                 concurrency_keys: Iterable[str | None] | None = None,
                 depends_on: Iterable[uuid.UUID | str] | None = None, on_parent_failure: str = "cancel",
                 schema: str | None = None) -> list[uuid.UUID]:
    """Enqueue many tasks of one kind in one set-based statement; returns their ids in order.
    Workers get one notification per queue, not one per task. `concurrency_key` applies to
    every task; `concurrency_keys` gives one per payload (None: `concurrency_key`). `depends_on`
    and `on_parent_failure` apply to every task (see enqueue)."""
    payloads = list(payloads)
    keys = list(idempotency_keys) if idempotency_keys is not None else None
    if keys is not None and len(keys) != len(payloads):
        raise InvalidInput("idempotency_keys must have one entry per payload")
    groups = list(concurrency_keys) if concurrency_keys is not None else None
    if groups is not None and len(groups) != len(payloads):
        raise InvalidInput("concurrency_keys must have one entry per payload")
    if not payloads:
        return []
    if keys is not None and all(k is None for k in keys):
        keys = None
    if groups is not None and all(g is None for g in groups):
        groups = None
    first = TaskSpec(kind, payloads[0], queue=queue, priority=priority, run_at=run_at, delay=delay,
                     idempotency_key=keys[0] if keys else None, max_attempts=max_attempts,
                     max_payload_bytes=_max_payload(), concurrency_key=concurrency_key,
                     depends_on=depends_on, on_parent_failure=on_parent_failure)
    if (len(payloads) >= store_mod.COPY_THRESHOLD and delay is None and run_at is None and keys is None
            and groups is None and not first.depends_on):
        # the common case, streamed: each payload is checked as it is written
        return _insert(conn_or_url, schema, lambda conn, schema: store_mod.copy_many(conn, first, payloads, schema))
    # a None in concurrency_keys is concurrency_key: the first spec's, as validated
    base = first
    if groups is not None:
        first = base.with_payload(payloads[0], keys[0] if keys else None, groups[0])
    rest = zip(payloads[1:], keys[1:] if keys else itertools.repeat(None),
               groups[1:] if groups else itertools.repeat(None))
    specs = [first] + [base.with_payload(p, k, g) for p, k, g in rest]
    return _insert(conn_or_url, schema, lambda conn, schema: store_mod.task_insert(conn, specs, schema))


def migrate(url: str, schema: str | None = None) -> list[str]:
    """Apply pending migrations; returns the names applied."""
    return [m.path.name for m in migrations.apply(url, _schema(schema))]

"""New tasks: the statements that write them, for a psycopg Connection and an AsyncConnection alike.

Each way of writing tasks is a *plan* (plans.py), so `skiplock.enqueue` and
`skiplock.enqueue_async` run the very same statements, savepoints, idempotency lookups and
errors. The inserts a unique key or a debounce key may turn into an existing task are
unique_inserts.py's; a plain enqueue never reaches them.

Every plan writes in the caller's transaction: inside a savepoint when the connection is in one
(or will be: a connection that is not in autocommit opens one at the first statement), so that a
refused batch leaves that transaction as it was; as a statement of its own on an idle autocommit
connection.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import psycopg

from .. import queries
from ..errors import InvalidInput, MigrationError
from ..ids import TaskId, existing_id, uuid7
from ..model import TaskSpec
from .connection import jsonb
from .copy import COPY_THRESHOLD, copy_line, copy_pieces, pieces
# _Query, _run, _run_async and _unit are named here too: signal_sends.py imports them from here
from .plans import Plan, _Copy, _Idle, _Query, _RawJson, _run, _run_async, _unit  # noqa: F401
from .plans import columns as _columns, dependent_columns
from . import routed
from .unique_inserts import keyed_plan


# -- plans

def _insert_plan(specs: Sequence[TaskSpec], schema: str) -> Plan:
    """Insert tasks, one id per spec, in order; a spec whose idempotency key is taken gets the
    existing task's id. The database writes their 'queued' events and wakes the workers (the
    tasks_inserted trigger)."""
    if not specs:
        return []
    sql = queries.load(schema)
    ids = uuid7.many(len(specs), TaskId)
    if any(s.unique is not None or s.debounce is not None for s in specs):
        return (yield from _unit(keyed_plan(specs, ids, sql), one_statement=False))
    if any(s.depends_on for s in specs):
        return (yield from _unit(_dependent_plan(specs, ids, sql, schema), one_statement=False))
    if len(specs) >= COPY_THRESHOLD and all(
            s.idempotency_key is None and s.delay is None and s.run_at is None for s in specs):
        texts = [u.hex for u in ids]  # Postgres reads a uuid without dashes too
        lines = ("".join(map(copy_line, texts[i:j], specs[i:j])) for i, j in pieces(len(specs)))
        yield from _unit(_copy_once(sql, lines), one_statement=True)
        return ids
    if len(specs) == 1:  # the common single enqueue: plain parameters, no arrays to build and unnest
        s = specs[0]
        statement, params = sql["task_insert_one"], dict(
            id=ids[0], kind=s.kind, queue=s.queue, priority=s.priority, payload=_RawJson(s.payload_json),
            max_attempts=s.max_attempts, delay=s.delay, run_at=s.run_at, idempotency_key=s.idempotency_key,
            concurrency_key=s.concurrency_key, trace_context=jsonb(s.trace_context))
    else:
        statement, params = sql["task_insert"], _columns(specs, ids)
    inserted = {row[0] for row in (yield _Query(statement, params))}
    keyed = [i for i, s in enumerate(specs) if s.idempotency_key is not None and ids[i] not in inserted]
    orphans = []
    if keyed:
        # the key's owner committed before our INSERT (ON CONFLICT waited for it), so this
        # new statement's snapshot sees it
        keys = list({specs[i].idempotency_key for i in keyed})
        existing = dict((yield _Query(sql["task_ids_by_idempotency_key"], {"keys": keys})))
        for i in keyed:
            owner = existing.get(specs[i].idempotency_key)
            if owner is None:
                # a duplicate key inside this very batch: the first occurrence won
                owner = next((ids[j] for j in range(i) if specs[j].idempotency_key == specs[i].idempotency_key
                              and ids[j] in inserted), None)
            if owner is None:
                orphans.append(i)
            else:
                ids[i] = existing_id(owner)
    if orphans:
        # the key's task was deleted (retention) between our INSERT and the lookup: the key is
        # free again, so insert these once more
        for i, task_id in zip(orphans, (yield from _insert_plan([specs[i] for i in orphans], schema))):
            ids[i] = task_id
    return ids


def _dependent_plan(specs: Sequence[TaskSpec], ids: list[uuid.UUID], sql: dict[str, str], schema: str) -> Plan:
    """Tasks with parents: lock the parents (task_parents_watch: their outcomes cannot happen
    unseen until this commits), count the ones not final and the ones failed or cancelled, insert
    each task 'waiting', 'queued' (every parent done) or 'cancelled' (a failed parent, and
    on_parent_failure 'cancel'), then its edges."""
    parents = sorted({p for s in specs for p in s.depends_on})
    states = {i: state for i, state, _ in (yield _Query(sql["task_parents_watch"], {
        "ids": parents, "channel": f"skiplock_{schema}"}))}
    missing = [p for p in parents if p not in states]
    if missing:
        raise InvalidInput(f"depends_on: no task {missing[0]} (in schema {schema})")
    inserted = [row[0] for row in (yield _Query(sql["task_insert_dependent"], dict(
        _columns(specs, ids), **dependent_columns(specs, states))))]
    new = set(inserted)
    if len(inserted) < len(specs):
        # a taken idempotency key: the existing task stands, with the parents it has
        keys = list({s.idempotency_key for s, i in zip(specs, ids) if i not in new})
        existing = dict((yield _Query(sql["task_ids_by_idempotency_key"], {"keys": keys})))
        ids = [i if i in new or s.idempotency_key not in existing else existing_id(existing[s.idempotency_key])
               for s, i in zip(specs, ids)]
    edges = [(i, p) for s, i in zip(specs, ids) if i in new for p in s.depends_on]
    yield _Query(sql["task_dependencies_insert"], {"task_ids": [e[0] for e in edges],
                                                   "parent_ids": [e[1] for e in edges]})
    return ids


def _copy_once(sql: dict[str, str], texts: Iterable[str]) -> Plan:
    yield _Copy(sql["task_copy_in"], texts)


def _copy_many_plan(template: TaskSpec, payloads: Sequence[Any], schema: str) -> Plan:
    """enqueue_many's common case: plain tasks (no idempotency key, no delay) that differ only in
    their payloads, the other fields taken from `template` (validated once). Each piece's ids are
    made and its payloads encoded and checked as it is written, while Postgres stores the previous
    piece; one refused leaves nothing written."""
    ids: list[uuid.UUID] = []
    yield from _unit(_copy_once(queries.load(schema), copy_pieces(template, payloads, ids)), one_statement=True)
    return ids


# Enqueue relies on migration 0007: since it, the database writes a task's 'queued' event and
# wakes the workers (the tasks_inserted trigger). Into a schema without it, a task would be stored
# with neither, so enqueue refuses instead. Checked once per database and schema in a process
# (migrations only go forward), in pg_catalog, which every role may read.
_REQUIRED = ("0007", "tasks_inserted")
_schema_ok: dict[tuple, bool] = {}  # (host, port, database, schema) -> whether its tasks are distributed
_schema_ok_on: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # connection -> {schema: distributed}


def _checked_plan(conn: psycopg.Connection | psycopg.AsyncConnection, schema: str, write: "TaskWrite") -> Plan:
    """`write`'s plan, after checking once that `schema` has the tasks table and its trigger, or
    the distributed placement (whose statements write what the trigger writes: store/routed.py)."""
    distributed = yield from placement_plan(conn, schema)
    return (yield from (write.routed_plan(schema, _database(conn)) if distributed else write.plan(schema)))


def _database(conn: psycopg.Connection | psycopg.AsyncConnection) -> tuple:
    """(host, port, database name) of `conn`."""
    info = conn.info
    return info.host, info.port, info.dbname


def placement_plan(conn: psycopg.Connection | psycopg.AsyncConnection, schema: str) -> Plan:
    """Whether `schema`'s tasks are distributed (store/routed.py), after checking once that it has
    the tasks table and its trigger or the distributed placement; MigrationError otherwise."""
    distributed = _schema_ok_on.get(conn, {}).get(schema)
    if distributed is None:
        key = (*_database(conn), schema)
        distributed = _schema_ok.get(key)
        if distributed is None:
            sql = queries.load(schema)
            [(tasks, trigger)] = yield _Query(
                "SELECT to_regclass(%(tasks)s) IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_trigger "
                "WHERE tgrelid = to_regclass(%(tasks)s) AND tgname = %(trigger)s)",
                {"tasks": f"{schema}.tasks", "trigger": _REQUIRED[1]})
            if not tasks:
                raise MigrationError(f"the skiplock schema is missing (no table {schema}.tasks): run `skiplock migrate`")
            distributed = False
            if not trigger:
                [(citus,)] = yield _Query(sql["placement_citus_catalog"], {})
                if citus:
                    [(distributed,)] = yield _Query(sql["placement_tasks_distributed"], {})
                if not distributed:
                    raise MigrationError(f"database schema {schema!r} lacks migration {_REQUIRED[0]}, which this "
                                         "version of skiplock enqueues into: run `skiplock migrate`, then upgrade "
                                         "the enqueuers")
            _schema_ok[key] = distributed
        _schema_ok_on.setdefault(conn, {})[schema] = distributed
    return distributed


class TaskWrite(NamedTuple):
    """What an enqueue writes: `specs`, or (COPY's common case) `template` with each of `payloads`."""
    specs: Sequence[TaskSpec] = ()
    template: TaskSpec | None = None
    payloads: Sequence[Any] = ()

    def plan(self, schema: str) -> Plan:
        if self.template is not None:
            return _copy_many_plan(self.template, self.payloads, schema)
        return _insert_plan(self.specs, schema)

    def routed_plan(self, schema: str, database: tuple) -> Plan:
        """The plan on the distributed placement (store/routed.py), into `database` (_database)."""
        specs = routed.specs_of(self.template, self.payloads) if self.template is not None else self.specs
        return routed.insert_plan(specs, queries.load(schema), schema, database)


# -- the doors

def schema_check(conn: psycopg.Connection, schema: str) -> None:
    """MigrationError unless `schema` has the tasks table and its trigger (checked once)."""
    _run(conn, _checked_plan(conn, schema, TaskWrite()))


def task_insert(conn: psycopg.Connection, specs: Sequence[TaskSpec], schema: str = "skiplock",
                distributed: bool = False) -> list[uuid.UUID]:
    """Insert tasks on `conn`, in whatever transaction it is in (see _insert_plan; `distributed`:
    the placement's plan, store/routed.py)."""
    if distributed:
        return _run(conn, routed.insert_plan(specs, queries.load(schema), schema, _database(conn)))
    return _run(conn, _insert_plan(specs, schema))


def copy_many(conn: psycopg.Connection, template: TaskSpec, payloads: Sequence[Any],
              schema: str = "skiplock") -> list[uuid.UUID]:
    """Plain tasks in bulk, through COPY (see _copy_many_plan)."""
    return _run(conn, _copy_many_plan(template, payloads, schema))


def tasks_write(conn: psycopg.Connection, write: TaskWrite, schema: str) -> list[uuid.UUID]:
    """skiplock.enqueue's write: `write` on the caller's connection, the schema checked first."""
    return _run(conn, _checked_plan(conn, schema, write))


async def tasks_write_async(conn: psycopg.AsyncConnection, write: TaskWrite, schema: str) -> list[uuid.UUID]:
    """skiplock.enqueue_async's write: the same plan as tasks_write, on an AsyncConnection."""
    return await _run_async(conn, _checked_plan(conn, schema, write))

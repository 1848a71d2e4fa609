"""The machinery of write plans: a plan is a generator that yields the database operations to run
(`_Query`, `_Copy`, `_Idle`) and receives each one's answer. `_run` carries a plan out on a
Connection, `_run_async` on an AsyncConnection, so the sync and asyncio doors of a write run the
very same statements, savepoints and errors, and cannot drift apart. An error of an operation is
thrown into the plan at its yield, so a plan's `try` rolls back its own savepoint.

The plans themselves are their owners' (task_inserts.py, unique_inserts.py, signal_sends.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterable, Sequence
from typing import Any, NamedTuple

import psycopg

from ..errors import SkiplockError
from ..model import CANCELLED, FAILED, FINISHED_STATES, QUEUED, WAITING, TaskSpec
from .connection import jsonb
from .translation import translated_errors


class _RawJson(psycopg.types.json.Jsonb):
    """Already-encoded JSON text, passed through without a second dumps()."""

    def __init__(self, text: str):
        super().__init__(text, dumps=lambda text: text)


class _Query(NamedTuple):
    """Run a statement; answers its rows ([] for a statement that returns none)."""
    sql: str
    params: dict | None = None


class _Copy(NamedTuple):
    """COPY FROM STDIN, the texts written piece by piece; answers None."""
    sql: str
    texts: Iterable[str]


class _Idle(NamedTuple):
    """Answers whether the connection is in autocommit and outside a transaction (a statement
    there is a transaction of its own)."""


Plan = Generator[Any, Any, Any]


def _run(conn: psycopg.Connection, plan: Plan) -> Any:
    outcome: tuple[Any, Exception | None] = (None, None)
    while True:
        try:
            op = _next(plan, outcome)
        except StopIteration as done:
            return done.value
        try:
            with translated_errors(conn):
                if isinstance(op, _Query):
                    cursor = conn.execute(op.sql, op.params)
                    outcome = (cursor.fetchall() if cursor.description else [], None)
                elif isinstance(op, _Copy):
                    with conn.cursor().copy(op.sql) as copy:
                        for text in op.texts:  # an error here (a payload refused) aborts the COPY
                            copy.write(text.encode())
                    outcome = (None, None)
                else:
                    outcome = (_idle(conn), None)
        except Exception as exc:
            outcome = (None, exc)


async def _run_async(conn: psycopg.AsyncConnection, plan: Plan) -> Any:
    outcome: tuple[Any, Exception | None] = (None, None)
    while True:
        try:
            op = _next(plan, outcome)
        except StopIteration as done:
            return done.value
        try:
            with translated_errors(conn):
                if isinstance(op, _Query):
                    cursor = await conn.execute(op.sql, op.params)
                    outcome = (await cursor.fetchall() if cursor.description else [], None)
                elif isinstance(op, _Copy):
                    async with conn.cursor().copy(op.sql) as copy:
                        for text in op.texts:
                            await copy.write(text.encode())
                    outcome = (None, None)
                else:
                    outcome = (_idle(conn), None)
        except Exception as exc:
            outcome = (None, exc)


def _next(plan: Plan, outcome: tuple[Any, Exception | None]) -> Any:
    """The plan's next operation, given the last one's (answer, error): an error is raised in
    the plan where it yielded. StopIteration carries the plan's result."""
    reply, error = outcome
    return plan.send(reply) if error is None else plan.throw(error)


def _idle(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _unit(inner: Plan, *, one_statement: bool) -> Plan:
    """`inner` as all or nothing in the caller's transaction: a savepoint, rolled back if it
    fails. On an idle autocommit connection, a single statement needs nothing around it, and
    several get a transaction of their own."""
    if (yield _Idle()):
        if one_statement:
            return (yield from inner)
        begin, keep, undo = "BEGIN", "COMMIT", "ROLLBACK"
    else:
        begin, keep, undo = ("SAVEPOINT skiplock_enqueue", "RELEASE SAVEPOINT skiplock_enqueue",
                             "ROLLBACK TO SAVEPOINT skiplock_enqueue")
    yield _Query(begin)
    try:
        result = yield from inner
    except BaseException:
        try:
            yield _Query(undo)
        except SkiplockError:
            pass  # the connection itself is broken: the original error says why
        raise
    yield _Query(keep)
    return result


def columns(specs: Sequence[TaskSpec], ids: list[uuid.UUID]) -> dict:
    """The parallel arrays of the task insert statements (task_insert, task_insert_dependent,
    task_insert_unique)."""
    return dict(
        ids=ids, kinds=[s.kind for s in specs], queues=[s.queue for s in specs],
        priorities=[s.priority for s in specs], payloads=[_RawJson(s.payload_json) for s in specs],
        max_attempts=[s.max_attempts for s in specs], delays=[s.delay for s in specs],
        run_ats=[s.run_at for s in specs], idempotency_keys=[s.idempotency_key for s in specs],
        concurrency_keys=[s.concurrency_key for s in specs],
        trace_contexts=[jsonb(s.trace_context) for s in specs])


def dependent_columns(specs: Sequence[TaskSpec], states: dict[uuid.UUID, str]) -> dict[str, list]:
    """The first state and counters of each task with parents, from its parents' `states` (as
    locked): 'waiting' while any is not final, 'queued' once all are, 'cancelled' with a failed or
    cancelled parent and on_parent_failure 'cancel'; the columns task_insert_dependent adds to
    columns()."""
    out: dict[str, list] = {k: [] for k in ("states", "waiting_on", "failed_parents", "last_errors",
                                            "on_parent_failures")}
    for s in specs:
        waiting = [p for p in s.depends_on if states[p] not in FINISHED_STATES]
        failed = [p for p in s.depends_on if states[p] in (FAILED, CANCELLED)]
        if failed and s.on_parent_failure == "cancel":
            state, error = CANCELLED, f"parent {failed[0]} ended {states[failed[0]]}"
        else:
            state, error = (WAITING if waiting else QUEUED), None
        for key, value in zip(out, (state, len(waiting), len(failed), error, s.on_parent_failure)):
            out[key].append(value)
    return out

"""Durable execution's tables (task_steps, signals) and the suspended tasks' wake-up: one method
per statement of engine/sql/steps.sql, named after it.

The writes a run makes in its own transaction (a step_transaction, a suspension) take that
connection; the rest borrow one. Which call of a handler a record answers, and what a mismatch
means, is the worker's decision (worker/durable.py).
"""

from __future__ import annotations

import datetime as dt
import uuid
from contextlib import nullcontext
from typing import Any

import psycopg

from ..errors import DatabaseUnavailable
from ..model import Signal, StepRecord
from .connection import jsonb
from .database import Database
from .routed import RoutedTasks
from .signal_sends import Sent, signal_send


class StepRowLocked(DatabaseUnavailable):
    """A step's record waited too long for its task's row."""


class StepStore:
    """Queries of task_steps and signals, and the wake-up of suspended tasks."""

    def __init__(self, db: Database, routed: RoutedTasks):
        self.db = db
        # the advisory lock's first key: signals of this schema only
        self.namespace = f"skiplock.signals {db.schema}"
        self._routed = routed  # the wake-up's statements on the distributed placement

    # -- a run's records
    def task_steps_read(self, task_id: uuid.UUID, queue: str) -> tuple[list[StepRecord], dt.datetime | None]:
        """A task's records in call order, and the database's clock (None when it has none); the
        task's `queue` routes the read on the distributed placement."""
        name = "routed_task_steps_read" if self.db.distributed else "task_steps_read"
        with self.db.connection() as conn:
            rows = conn.execute(self.db.sql[name], {"task_id": task_id, "queue": queue}).fetchall()
        return [StepRecord(*row[:8]) for row in rows], (rows[0][8] if rows else None)

    def task_step_record(self, conn: psycopg.Connection | None, task_id: uuid.UUID, queue: str, token: int,
                         attempt: int, position: int, name: str, occurrence: int, type_: str, result: Any) -> bool:
        """Write one record, fenced by `token`, on `conn` (in its transaction) or on a pooled
        connection (committed). False: nothing written (refused, or already there)."""
        params = dict(task_id=task_id, queue=queue, token=token, attempt=attempt, position=position, name=name,
                      occurrence=occurrence, type=type_, result=jsonb(result))
        return bool(self._fenced(conn, "task_step_record", params))

    def task_step_record_guarded(self, task_id: uuid.UUID, queue: str, token: int, attempt: int, position: int,
                                 name: str, occurrence: int, type_: str, result: Any) -> bool:
        """task_step_record in a transaction of its own that waits at most 5 s for the task's
        row (engine/sql/steps.sql, task_step_lock_timeout says why); StepRowLocked past that."""
        with self.db.connection() as conn:
            try:
                with conn.transaction():
                    conn.execute(self.db.sql["task_step_lock_timeout"])
                    return self.task_step_record(conn, task_id, queue, token, attempt, position, name,
                                                 occurrence, type_, result)
            except psycopg.errors.LockNotAvailable:
                raise StepRowLocked("the task's row stayed locked for 5 s while a step was recorded: this run's own "
                                    "transaction holds it if it enqueued a child that depends on the running task "
                                    "outside a step (enqueue it inside the step)") from None

    def task_step_resolve(self, conn: psycopg.Connection | None, task_id: uuid.UUID, queue: str, token: int,
                          position: int, result: Any) -> bool:
        params = dict(task_id=task_id, queue=queue, token=token, position=position, result=jsonb(result))
        return bool(self._fenced(conn, "task_step_resolve", params))

    def task_step_time(self, conn: psycopg.Connection, seconds: float) -> dt.datetime:
        return conn.execute(self.db.sql["task_step_time"], {"seconds": seconds}).fetchone()[0]

    def task_awaited_insert(self, conn: psycopg.Connection, task_id: uuid.UUID, queue: str,
                            parents: dict[uuid.UUID, str | None]) -> set[uuid.UUID]:
        """The edges from the awaited tasks `parents` ({id: queue, None for one that does not
        exist}) to the task (of `queue`); the awaited tasks that were not awaited already."""
        if self.db.distributed:
            ids = sorted(i for i, parent_queue in parents.items() if parent_queue is not None)
            rows = conn.execute(self.db.sql["routed_awaited_insert"], {
                "parent_queues": [parents[i] for i in ids], "parent_ids": ids,
                "queues": [queue] * len(ids), "task_ids": [task_id] * len(ids)}).fetchall()
        else:
            rows = conn.execute(self.db.sql["task_awaited_insert"],
                                {"task_id": task_id, "parent_ids": list(parents)}).fetchall()
        return {row[0] for row in rows}

    def task_steps_list(self, task_id: uuid.UUID, after: int = 0, limit: int = 100) -> list[StepRecord]:
        return self.db.fetch_as("task_steps_list", dict(task_id=task_id, after=after, limit=limit), StepRecord)

    def _fenced(self, conn: psycopg.Connection | None, name: str, params: dict) -> list[tuple]:
        """A fenced write of steps.sql on `conn` or a pooled connection; on the distributed
        placement the fence (routed_step_fence) then the write, in one transaction (a savepoint of
        `conn`'s)."""
        if not self.db.distributed:
            if conn is None:
                return self.db.fetch(name, params)
            return conn.execute(self.db.sql[name], params).fetchall()
        with (nullcontext(conn) if conn is not None else self.db.connection()) as conn, conn.transaction():
            if not conn.execute(self.db.sql["routed_step_fence"], params).fetchall():
                return []
            return conn.execute(self.db.sql[f"routed_{name}"], params).fetchall()

    # -- the wake-up
    def task_wake_due(self, limit: int = 1000) -> int:
        """Queue suspended tasks whose time came; returns how many (on the distributed placement
        queue by queue: store/routed.py)."""
        if self.db.distributed:
            return self._routed.wake_due(limit)
        return self.db.fetch("task_wake_due", {"limit": limit, "channel": self.db.channel})[0][0]

    # -- signals
    def signal_try_lock(self, conn: psycopg.Connection, name: str) -> bool:
        """In a suspension's transaction: True when no send of `name` is in flight (held shared
        to the commit, so that a later send waits for it)."""
        return conn.execute(self.db.sql["signal_try_lock"], {"namespace": self.namespace, "name": name}).fetchone()[0]

    def signal_send(self, name: str, payload: Any) -> Sent:
        """skiplock.send_signal's write (`name` and `payload` checked already), on this store's
        connection: on a transaction's store, in that transaction (the API commits it with its
        audit row)."""
        with self.db.connection() as conn:
            return signal_send(conn, name, payload, self.db.schema)

    def signal_get(self, name: str) -> Signal | None:
        rows = self.db.fetch_as("signal_get", {"name": name}, Signal)
        return rows[0] if rows else None

    def signal_list(self, prefix: str | None = None, limit: int = 100,
                    before: tuple[dt.datetime, str] | None = None) -> list[Signal]:
        before_at, before_name = before if before else (None, None)
        return self.db.fetch_as("signal_list", dict(prefix=prefix, limit=limit, before_at=before_at,
                                                    before_name=before_name), Signal)

    def signal_delete_old(self, older_than: float, limit: int = 500) -> int:
        return len(self.db.fetch("signal_delete_old", {"older_than": older_than, "limit": limit}))

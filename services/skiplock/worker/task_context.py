"""What a handler sees: `ctx`, its read-only facts about the run, and `ctx.transaction()`.

A handler's transaction stays open until the handler returns; the worker then writes the task's
outcome (fenced by the lease token) on the same connection and commits both together. If the fence
refuses, everything the handler wrote rolls back.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import contextmanager
from typing import Any

from ..engine.model import ClaimedTask, Parent, TooManyChildren
from .held_transaction import HeldTransaction


# ctx.parents()'s bound: a fan-in of more parents reads them with a larger limit
PARENTS_READ = 1000
# (database, schema, queue, kind) this process registered in queue_kinds (ctx.enqueue); a set's
# add and membership test are atomic, and a pair registered twice costs one statement
_REGISTERED: set[tuple[str, str, str, str]] = set()


class TaskContext:
    __slots__ = ("_task", "_cancel", "_open_tx", "_store", "_max_children", "_children")

    def __init__(self, task: ClaimedTask, store, max_children: int = 10_000):
        self._task = task
        self._cancel = False  # set once by another thread, read by the handler: a plain flag will do
        self._open_tx: HeldTransaction | None = None  # the handler's own transaction, while held
        self._store = store
        # the children all commit with the run's outcome, in one transaction that grows with them
        # and holds their rows' locks meanwhile: SKIPLOCK_MAX_CHILDREN_PER_RUN bounds it
        self._max_children = max_children
        self._children = 0

    @property
    def log(self) -> logging.Logger:
        """The logger `skiplock.task.<kind>`. Its records, like any logged while the handler runs,
        carry task_id, kind, queue and attempt (engine/logs.py)."""
        return logging.getLogger("skiplock.task." + self._task.kind)

    @property
    def task_id(self) -> uuid.UUID:
        return self._task.id

    @property
    def kind(self) -> str:
        return self._task.kind

    @property
    def queue(self) -> str:
        return self._task.queue

    @property
    def attempt(self) -> int:
        return self._task.attempt

    @property
    def cursor(self) -> Any:
        return self._task.cursor

    @property
    def cancel_requested(self) -> bool:
        """True once the task was cancelled, its timeout passed, its lease was lost, or the
        worker is shutting down without time left. A long handler should check it and return."""
        return self._cancel

    def request_cancel(self) -> None:
        self._cancel = True

    @contextmanager
    def transaction(self):
        """A psycopg connection in a transaction that commits together with the task's outcome.

        Writes made here are committed only if the task's completion (or checkpoint) is accepted
        by its lease fence; a raised exception, a retry or a lost lease rolls them back. Opened
        again (or after ctx.enqueue), it is the same transaction.
        """
        yield self._held_connection()
        # the commit waits for the handler's return value: see Completer._settle_in_transaction

    def _held_connection(self):
        if self._open_tx is None:
            self._open_tx = HeldTransaction(self._store)
        return self._open_tx.conn

    def enqueue(self, kind: str, payload: Any = None, **options) -> uuid.UUID:
        """skiplock.enqueue in this run's transaction (ctx.transaction()): the child exists only
        if this run's completion or checkpoint is accepted by its lease fence; a stale run's
        children never appear. It may depend on its siblings (depends_on=[an id this returned])
        and on this task itself."""
        from ..enqueueing import enqueue

        self._count_children(1)
        self._register(options.get("queue", "default"), kind)
        return enqueue(self._held_connection(), kind, payload, schema=self._store.schema, **options)

    def enqueue_many(self, kind: str, payloads, **options) -> list[uuid.UUID]:
        """skiplock.enqueue_many in this run's transaction, as ctx.enqueue."""
        from ..enqueueing import enqueue_many

        payloads = list(payloads)
        self._count_children(len(payloads))
        self._register(options.get("queue", "default"), kind)
        return enqueue_many(self._held_connection(), kind, payloads, schema=self._store.schema, **options)

    def _count_children(self, more: int) -> None:
        if self._children + more > self._max_children:
            raise TooManyChildren(f"this run enqueued {self._children} children and asked for {more} more: at most "
                                  f"{self._max_children} per run (SKIPLOCK_MAX_CHILDREN_PER_RUN); enqueue a larger "
                                  "fan-out in steps or from the children")
        self._children += more

    def _register(self, queue: str, kind: str) -> None:
        """Commit the (queue, kind) pair on its own first (queue_kind_register says why), once per
        process and pair."""
        key = (self._store.url, self._store.schema, queue, kind)
        if key not in _REGISTERED:
            self._store.tasks.queue_kind_register(queue, kind)
            _REGISTERED.add(key)

    def parents(self, limit: int = PARENTS_READ) -> list[Parent]:
        """This task's parents (depends_on), at most `limit`, in id order: id, kind, state, result
        and last error, as they are now."""
        return self._store.tasks.task_parents(self._task.id, limit)

    def take_transaction(self) -> HeldTransaction | None:
        """The handler's open transaction, now the caller's to end, or None."""
        held, self._open_tx = self._open_tx, None
        return held

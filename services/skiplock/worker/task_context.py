"""What a handler sees: `ctx`, its read-only facts about the run, `ctx.transaction()`, and the
calls of durable execution (`ctx.step` and the waits, worker/durable.py).

A handler's transaction stays open until the handler returns; the worker then writes the task's
outcome (fenced by the lease token) on the same connection and commits both together. If the fence
refuses, everything the handler wrote rolls back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from ..engine.model import ClaimedTask, Parent, TooManyChildren
from ..engine.registry import queue_of
from .durable import DurableRun, Suspend, checked_seconds, checked_when, task_ids
from .held_transaction import HeldTransaction


# ctx.parents()'s bound: a fan-in of more parents reads them with a larger limit
PARENTS_READ = 1000
# (database, schema, queue, kind) this process registered in queue_kinds (ctx.enqueue); a set's
# add and membership test are atomic, and a pair registered twice costs one statement
_REGISTERED: set[tuple[str, str, str, str]] = set()
# held while a run's DurableRun is made (once per run that uses durable execution)
_MAKING = threading.Lock()


class TaskContext:
    __slots__ = ("_task", "_cancel", "_open_tx", "_store", "_max_children", "_children", "_durable")

    def __init__(self, task: ClaimedTask, store, max_children: int = 10_000):
        self._task = task
        self._cancel = False  # set once by another thread, read by the handler: a plain flag will do
        self._open_tx: HeldTransaction | None = None  # the handler's own transaction, while held
        self._store = store
        # the children all commit with the run's outcome, in one transaction that grows with them
        # and holds their rows' locks meanwhile: SKIPLOCK_MAX_CHILDREN_PER_RUN bounds it
        self._max_children = max_children
        self._children = 0
        self._durable: DurableRun | None = None  # made at the first durable call

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
        if self._durable is not None and self._durable.in_step:
            return self._durable.step_connection()  # a step's writes commit with its record
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
        self._register(queue_of(kind, options.get("queue")), kind)
        return enqueue(self._held_connection(), kind, payload, schema=self._store.schema, **options)

    def enqueue_many(self, kind: str, payloads, **options) -> list[uuid.UUID]:
        """skiplock.enqueue_many in this run's transaction, as ctx.enqueue."""
        from ..enqueueing import enqueue_many

        payloads = list(payloads)
        self._count_children(len(payloads))
        self._register(queue_of(kind, options.get("queue")), kind)
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

    # -- durable execution (worker/durable.py); in an async handler each returns an awaitable
    def step(self, name: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run `fn(*args, **kwargs)` once and record its JSON result, fenced by this run's lease,
        before going on; on a later run of the task the recorded result comes back and `fn` is
        not called. Children it enqueues (ctx.enqueue) commit with the record."""
        if _in_event_loop():
            return self._step_async(name, fn, args, kwargs)
        run, call, record = self._step_call(self._durable_run(), name)
        if record is not None:
            return record.result
        with run.stepping():
            return run.finish_step(call, fn(*args, **kwargs))

    @staticmethod
    def _step_call(run: DurableRun, name: str):
        """(run, the call, its record or None)."""
        call = run.next_call(name, "step")
        return run, call, run.recorded(call)

    async def _step_async(self, name, fn, args, kwargs) -> Any:
        run, call, record = self._step_call(await asyncio.to_thread(self._durable_run), name)
        if record is not None:
            return record.result
        with run.stepping():
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            return await asyncio.to_thread(run.finish_step, call, value)

    def step_transaction(self, name: str, fn: Callable[..., Any] | None = None, *args, **kwargs) -> Any:
        """A step whose database writes commit with its record, in one transaction fenced by this
        run's lease: exactly once, whatever crashes and zombies do.

        `ctx.step_transaction(name, fn, *args)` calls `fn(conn, *args)` and returns its result
        (recorded; a later run gets it back without calling `fn`). `with ctx.step_transaction(name)
        as conn:` runs the block; on a later run the block runs again on a transaction that is
        rolled back, so that its writes still commit once (use the first form when the block's
        values matter after it)."""
        if fn is None:
            return self._step_block(name)
        if _in_event_loop():
            return asyncio.to_thread(self._step_transaction, name, fn, args, kwargs)
        return self._step_transaction(name, fn, args, kwargs)

    def _step_transaction(self, name, fn, args, kwargs) -> Any:
        run, call, record = self._step_call(self._durable_run(), name)
        if record is not None:
            return record.result
        with run.stepping():
            return run.finish_step(call, fn(run.step_connection(), *args, **kwargs))

    @contextmanager
    def _step_block(self, name: str):
        run, call, record = self._step_call(self._durable_run(), name)
        if record is not None:
            with run.stepping():  # its children go in the same transaction, rolled back too
                try:
                    yield run.step_connection()
                finally:
                    run.end_step_tx(commit=False)
            return
        with run.stepping():
            yield run.step_connection()
            run.finish_step(call, None)

    def sleep(self, seconds: float):
        """Suspend the task for `seconds` (durable: it holds no slot, lease or connection meanwhile,
        and spends no attempt); returns at once on the run after. 0 returns at once."""
        seconds = checked_seconds("sleep", seconds)
        return self._wait(lambda run: None if seconds == 0 else run.sleep(None, seconds))

    def sleep_until(self, when: dt.datetime):
        """Suspend the task until `when` (an aware datetime, the database's clock)."""
        when = checked_when(when)
        return self._wait(lambda run: run.sleep(when, None))

    def wait_for_signal(self, name: str, timeout: float | None = None):
        """The payload of the signal `name` (skiplock.send_signal), suspending the task until it
        is sent; None once `timeout` seconds (from the first call) passed without it."""
        if timeout is not None:
            timeout = checked_seconds("wait_for_signal timeout", timeout)
        return self._wait(lambda run: run.wait_for_signal(name, timeout))

    def wait_for_tasks(self, ids):
        """The outcomes of tasks `ids` (as ctx.parents() gives them, in id order), suspending the
        task until every one is final."""
        ids = task_ids(ids)
        if not ids:
            return self._wait(lambda run: [])
        return self._wait(lambda run: run.wait_for_tasks(ids, self._outcomes))

    def _outcomes(self, ids: list[uuid.UUID]) -> list[Parent]:
        # on the run's own transaction when it has one: children it enqueued there are not
        # committed yet, and are awaited all the same
        conn = self._open_tx.conn if self._open_tx is not None else None
        return self._store.tasks.task_outcomes(ids, conn=conn)

    def _wait(self, wait: Callable[[DurableRun], Any]):
        if _in_event_loop():
            return self._wait_async(wait)
        return self._suspending(wait, self._durable_run())

    async def _wait_async(self, wait):
        run = await asyncio.to_thread(self._durable_run)
        return await asyncio.to_thread(self._suspending, wait, run)

    @staticmethod
    def _suspending(wait, run: DurableRun):
        try:
            return wait(run)
        except Suspend as suspend:
            run.suspension = suspend
            raise

    def _durable_run(self) -> DurableRun:
        if self._durable is None:
            with _MAKING:  # two coroutines' first calls, each on a thread of its own, make one
                if self._durable is None:
                    from ..enqueueing import _max_payload
                    self._durable = DurableRun(self._task, self._store, _max_payload(),
                                               lambda: self._open_tx is not None)
        return self._durable

    @property
    def suspension(self) -> Suspend | None:
        """The wait that ended this run (the completer writes it), or None."""
        return self._durable.suspension if self._durable is not None else None

    def take_transaction(self) -> HeldTransaction | None:
        """The handler's open transaction, now the caller's to end, or None."""
        held, self._open_tx = self._open_tx, None
        return held


def _in_event_loop() -> bool:
    """True on the event loop's thread (an async handler): the durable calls return awaitables."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True

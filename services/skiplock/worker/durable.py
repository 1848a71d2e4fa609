"""Durable execution inside one run: `ctx.step`, `ctx.step_transaction`, `ctx.sleep`,
`ctx.sleep_until`, `ctx.wait_for_signal` and `ctx.wait_for_tasks` (docs/GUIDE.md, "Durable
execution"; the model in docs/ARCHITECTURE.md).

A handler runs from the top on every run. Each of these calls takes the next position in the run;
the task's records (task_steps, read at the first call) say what each position did before. A
recorded step returns its result; a new one runs and is recorded fenced by the run's lease token,
committed before the handler goes on. A wait that is not over ends the run by raising Suspend,
which the executor turns into the 'suspend' outcome (the completer writes it with the wait's
record: worker/suspension.py). A record the fence refuses raises ClaimLost: the run is a zombie's.

One DurableRun per run that uses any of this, made at its first call (a run that uses none pays
nothing) and used from the handler's thread only; its steps run one at a time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, NamedTuple

from ..engine.durable import MAX_STEPS_PER_TASK, check_name, check_seconds, check_when, encode_json
from ..engine.errors import InvalidInput, PayloadTooLarge
from ..engine.model import FINISHED_STATES, ClaimedTask, Fail, Parent, StepRecord
from .held_transaction import HeldTransaction


class Call(NamedTuple):
    position: int
    name: str
    occurrence: int
    type: str

    @property
    def label(self) -> str:
        return f"{self.type} {self.name!r}" + (f"#{self.occurrence}" if self.occurrence > 1 else "")


class Suspend(BaseException):
    """Ends the run: the task waits (a BaseException, so that a handler's `except Exception` does
    not swallow it). `call`: the wait's record to write with the outcome, None when it is recorded
    already; `seconds` or `until`: when it wakes on its own (a sleep, a signal wait's timeout)."""

    def __init__(self, reason: str, call: Call | None, *, seconds: float | None = None,
                 until: dt.datetime | None = None, signal: str | None = None,
                 awaited: list[uuid.UUID] | None = None):
        super().__init__(reason)
        self.reason, self.call, self.seconds, self.until = reason, call, seconds, until
        self.signal, self.awaited = signal, awaited


class ClaimLost(BaseException):
    """A record this run wrote was refused by its fence: another run owns the task now."""


def _refuse(exc: InvalidInput) -> Fail:
    """Bad input to a durable call fails the task with its line: running it again cannot help."""
    return Fail(str(exc))


class DurableRun:
    def __init__(self, task: ClaimedTask, store, max_bytes: int, run_tx_open: Callable[[], bool]):
        self.task, self.store, self.max_bytes = task, store, max_bytes
        self.run_tx_open = run_tx_open  # the run's own transaction (ctx.transaction()) is open
        records, self.db_now = store.steps.task_steps_read(task.id, task.queue)
        self.records: dict[int, StepRecord] = {r.position: r for r in records}
        self.position = 0
        self.occurrences: dict[str, int] = {}
        self.step_tx: HeldTransaction | None = None  # the open step's transaction, if it opened one
        self.in_step = False
        self.suspension: Suspend | None = None

    # -- positions
    def next_call(self, name: str, type_: str) -> Call:
        if self.in_step:
            raise Fail(f"{type_} {name!r} called inside another step: the calls of one run are made one at a "
                       "time, and a step cannot contain another")
        try:
            check_name("step" if type_ == "step" else type_, name)
        except InvalidInput as exc:
            raise _refuse(exc) from None
        if self.position >= MAX_STEPS_PER_TASK:
            raise Fail(f"more than {MAX_STEPS_PER_TASK} steps and waits in one task: enqueue the next round "
                       "as a new task")
        self.position += 1
        occurrence = self.occurrences[name] = self.occurrences.get(name, 0) + 1
        return Call(self.position, name, occurrence, type_)

    def recorded(self, call: Call) -> StepRecord | None:
        """The record at the call's position, or None; a record of another call fails the task
        (the handler changed under it) and is left as it is."""
        record = self.records.get(call.position)
        if record is None:
            return None
        if (record.name, record.occurrence, record.type) != (call.name, call.occurrence, call.type):
            recorded = Call(record.position, record.name, record.occurrence, record.type)
            raise Fail(f"step mismatch at position {call.position}: this run called {call.label}, the recorded "
                       f"call there is {recorded.label} (the handler changed under a task in flight)")
        return record

    def encoded(self, call: Call, value: Any) -> tuple[str, Any]:
        try:
            return encode_json(f"{call.label} result", value, self.max_bytes)
        except (InvalidInput, PayloadTooLarge) as exc:
            raise Fail(str(exc)) from None

    # -- writes
    def write(self, call: Call, result: Any, conn=None) -> None:
        """Record `call` fenced, on `conn` (in its transaction, not committed here) or on its own."""
        task, steps = self.task, self.store.steps
        args = (task.id, task.queue, task.lease_token, task.attempt, call.position, call.name, call.occurrence,
                call.type, result)
        if conn is None and self.run_tx_open():
            written = steps.task_step_record_guarded(*args)
        else:
            written = steps.task_step_record(conn, *args)
        if not written:
            raise ClaimLost(f"{call.label}: the record was refused, the claim was lost")
        self.records[call.position] = StepRecord(call.position, call.name, call.occurrence, call.type, result,
                                                 self.task.lease_token, self.task.attempt, None)

    def resolve(self, call: Call, result: Any) -> None:
        if not self.store.steps.task_step_resolve(None, self.task.id, self.task.queue, self.task.lease_token,
                                                  call.position, result):
            raise ClaimLost(f"{call.label}: the record was refused, the claim was lost")

    @contextmanager
    def stepping(self):
        """While a step's function runs: ctx.enqueue and ctx.transaction() use the step's own
        transaction (opened at their first use), committed with its record."""
        self.in_step = True
        try:
            yield
        except BaseException:
            self.end_step_tx(commit=False)
            raise
        finally:
            self.in_step = False

    def step_connection(self):
        if self.step_tx is None:
            self.step_tx = HeldTransaction(self.store)
        return self.step_tx.conn

    def finish_step(self, call: Call, value: Any) -> Any:
        """Record a step that returned `value`, with its transaction's writes if it has one;
        returns the value as it reads back."""
        text, value = self.encoded(call, value)
        if self.step_tx is None:
            self.write(call, value)
            return value
        try:
            self.write(call, value, self.step_tx.conn)
        except BaseException:
            self.end_step_tx(commit=False)
            raise
        self.end_step_tx(commit=True)
        return value

    def end_step_tx(self, commit: bool) -> None:
        held, self.step_tx = self.step_tx, None
        if held is None:
            return
        if commit:
            from .store_errors import translated
            try:
                with translated:
                    held.conn.commit()
            except BaseException:
                held.rollback(close=True)
                raise
            held.release()
        else:
            held.rollback()

    # -- waits
    def sleep(self, until: dt.datetime | None, seconds: float | None) -> None:
        call = self.next_call("sleep", "sleep")
        record = self.recorded(call)
        if record is None:
            raise Suspend("sleep", call, seconds=seconds, until=until)
        end = dt.datetime.fromisoformat(record.result["until"])
        if self.db_now is not None and self.db_now < end:
            raise Suspend("sleep", None, until=end)  # woken before its time (an operator's resume)

    def wait_for_signal(self, name: str, timeout: float | None) -> Any:
        call = self.next_call(name, "signal")
        record = self.recorded(call)
        if record is not None and record.result.get("resolved"):
            return record.result.get("payload")
        signal = self.store.steps.signal_get(name)
        if signal is not None:
            result = {"signal": name, "resolved": "signal", "payload": signal.payload}
            self.resolve(call, result) if record is not None else self.write(call, result)
            return signal.payload
        if record is None:
            raise Suspend("signal", call, seconds=timeout, signal=name)
        timeout_at = record.result.get("timeout_at")
        timeout_at = dt.datetime.fromisoformat(timeout_at) if timeout_at else None
        if timeout_at is not None and self.db_now is not None and self.db_now >= timeout_at:
            self.resolve(call, {"signal": name, "resolved": "timeout", "timeout_at": record.result["timeout_at"]})
            return None
        raise Suspend("signal", None, until=timeout_at, signal=name)

    def wait_for_tasks(self, ids: list[uuid.UUID], outcomes) -> list[Parent]:
        call = self.next_call("tasks", "tasks")
        record = self.recorded(call)
        if record is not None and record.result.get("ids") != ids_digest(ids):
            # ids made anew by this run (children enqueued outside a step) would be waited for
            # forever, one new set per wake-up
            raise Fail(f"wait_for_tasks at position {call.position} waits for other tasks than this task recorded "
                       "there: enqueue the children inside a step (ctx.step) so that a later run gets the same ids")
        parents = outcomes(ids)
        missing = set(ids) - {p.id for p in parents}
        if missing:
            raise Fail(f"wait_for_tasks: no task {sorted(missing)[0]} ({len(missing)} of {len(ids)} not found)")
        if all(p.state in FINISHED_STATES for p in parents):
            if record is None:
                self.write(call, {"tasks": len(ids), "ids": ids_digest(ids)})
            return parents
        raise Suspend("tasks", None if record is not None else call, awaited=ids)


def ids_digest(ids: list[uuid.UUID]) -> str:
    """What a wait for tasks records of its ids: enough to tell another set, at a fixed size."""
    return hashlib.sha256(b"".join(i.bytes for i in sorted(ids))).hexdigest()[:32]


def task_ids(ids) -> list[uuid.UUID]:
    """wait_for_tasks' ids, deduplicated in order, or Fail naming the first that is not one."""
    if isinstance(ids, (str, bytes, uuid.UUID)):
        raise Fail("wait_for_tasks takes a list of task ids")
    out: dict[uuid.UUID, None] = {}
    for value in ids:
        try:
            out[value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))] = None
        except ValueError:
            raise Fail(f"wait_for_tasks: {value!r} is not a task id") from None
    return list(out)


def checked_seconds(what: str, seconds: Any) -> float:
    try:
        return check_seconds(what, seconds)
    except InvalidInput as exc:
        raise _refuse(exc) from None


def checked_when(when: Any) -> dt.datetime:
    try:
        return check_when(when)
    except InvalidInput as exc:
        raise _refuse(exc) from None

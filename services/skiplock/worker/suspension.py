"""A suspension's write, in the run's own transaction before its 'suspend' outcome (the
completer's one variant of the outcome write, Completer._settle_in_transaction):

- the wait's record, fenced like every step (a sleep's end on the database's clock, the same
  now() as the outcome's);
- a signal wait takes the signal's lock shared without waiting: held, no send is in flight and any
  later send waits for this commit, then wakes the task; not held, a send is in flight, and the
  task is queued to run again in a second and look (engine/sql/steps.sql, signal_lock);
- a wait for tasks locks them and adds them as parents (the dependency mechanism of depends_on:
  the trigger queues the task after the last one is final).

The outcome itself (task_settle, outcome 'suspend') then decides: waiting, or queued at once when
what it waits for is there already.
"""

from __future__ import annotations

import datetime as dt

from ..engine.model import FINISHED_STATES, Settlement
from .durable import Suspend, ids_digest

# how soon a signal wait that met a send in flight looks again
_SEND_IN_FLIGHT_SECONDS = 1.0


def write_suspension(store, conn, task, suspend: Suspend, outcome: Settlement) -> Settlement | None:
    """The wait's writes on `conn`; the outcome to write after them, or None when the fence
    refused the record (the claim was lost: roll back)."""
    steps = store.steps
    wake_at: dt.datetime | None = suspend.until
    if suspend.seconds is not None:
        wake_at = steps.task_step_time(conn, suspend.seconds)
    waiting_on_add, ready = None, False
    if suspend.call is not None:
        call = suspend.call
        result = {"sleep": {"until": _iso(wake_at)},
                  "signal": {"signal": suspend.signal, "timeout_at": _iso(wake_at)},
                  "tasks": {"tasks": len(suspend.awaited or ()),
                            "ids": ids_digest(suspend.awaited) if suspend.awaited else None}}[suspend.reason]
        if not steps.task_step_record(conn, task.id, task.queue, task.lease_token, task.attempt, call.position,
                                      call.name, call.occurrence, call.type, result):
            return None
    delay = None
    if suspend.reason == "signal" and not steps.signal_try_lock(conn, suspend.signal):
        ready, delay = True, _SEND_IN_FLIGHT_SECONDS  # queued, claimable in a second: it looks again
    if suspend.reason == "tasks":
        queues, states = store.tasks.task_awaited_watch(conn, suspend.awaited)
        added = steps.task_awaited_insert(conn, task.id, task.queue, {i: queues.get(i) for i in suspend.awaited})
        waiting_on_add = sum(1 for i in added if states.get(i) not in FINISHED_STATES)
        ready = waiting_on_add == 0
    return outcome._replace(suspended=suspend.reason, wake_at=_iso(wake_at), awaited_signal=suspend.signal,
                            waiting_on_add=waiting_on_add, ready=ready, delay=delay)


def _iso(when: dt.datetime | None) -> str | None:
    return None if when is None else when.isoformat()

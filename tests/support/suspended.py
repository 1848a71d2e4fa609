"""Suspended tasks made the real way, for the surfaces' tests (API, CLI, console, gauges): each
enqueued, claimed and run by a worker of the test's own (tests/integration/test_durable.py's
fixture and round), so that its row, its step records and its events are what a worker writes.

The handlers are tests/support/durable_handlers.py's kinds that touch no other table before
they suspend.
"""

from __future__ import annotations

import time

import skiplock
import tests.support.durable_handlers  # noqa: F401 - registers the d.* kinds
from tests.integration.test_durable import run_round


def rounds_until(worker, db, ids, states: tuple[str, ...], timeout: float = 15.0) -> None:
    """Worker rounds until every task of `ids` is in one of `states` (a round claims what the
    worker's slots and its claim let it, not always everything claimable)."""
    deadline = time.monotonic() + timeout
    while True:
        found = dict(db.execute("SELECT id::text, state FROM skiplock.tasks WHERE id = ANY(%s::uuid[])",
                                ([str(i) for i in ids],)).fetchall())
        if len(found) == len(ids) and all(state in states for state in found.values()):
            return
        assert time.monotonic() < deadline, f"not {states}: {found}"
        run_round(worker)
        time.sleep(0.02)


def suspend_one_of_each(worker, db_url: str, db) -> dict[str, str]:
    """{"sleep": id, "signal": id, "tasks": id, "parents": id}: a task sleeping an hour after one
    step (d.async), one waiting for the signal `order-1.confirmed` with a timeout of an hour,
    one waiting for its 2 children (which are queued, not run), and a dependent of depends_on
    (of the sleeper): each 'waiting' with its reason."""
    ids = {
        "sleep": skiplock.enqueue(db_url, "d.async", {"seconds": 3600}),
        "signal": skiplock.enqueue(db_url, "d.signal", {"name": "order-1.confirmed", "timeout": 3600}),
        "tasks": skiplock.enqueue(db_url, "d.parent", {"children": 2}),
    }
    rounds_until(worker, db, list(ids.values()), ("waiting",))
    ids["parents"] = skiplock.enqueue(db_url, "d.child", {"i": 0}, depends_on=[ids["sleep"]])
    return {reason: str(task_id) for reason, task_id in ids.items()}

"""Suspended tasks made the real way, for the surfaces' tests (API, CLI, console, gauges): each
enqueued, claimed and run once by a worker of the test's own (tests/integration/test_durable.py's
fixture and round), so that its row, its step records and its events are what a worker writes.

The handlers are tests/support/durable_handlers.py's kinds that touch no other table on their
first run.
"""

from __future__ import annotations

import skiplock
import tests.support.durable_handlers  # noqa: F401 - registers the d.* kinds
from tests.integration.test_durable import run_round


def suspend_one_of_each(worker, db_url: str) -> dict[str, str]:
    """{"sleep": id, "signal": id, "tasks": id, "parents": id}: a task sleeping an hour after one
    step (d.async), one waiting for the signal `order-1.confirmed` with a timeout of an hour,
    one waiting for its 2 children, and a dependent of depends_on; the first three run once, so
    that each is 'waiting' with its reason. The children stay queued (not run)."""
    ids = {
        "sleep": skiplock.enqueue(db_url, "d.async", {"seconds": 3600}),
        "signal": skiplock.enqueue(db_url, "d.signal", {"name": "order-1.confirmed", "timeout": 3600}),
        "tasks": skiplock.enqueue(db_url, "d.parent", {"children": 2}),
    }
    assert run_round(worker) == 3
    ids["parents"] = skiplock.enqueue(db_url, "d.child", {"i": 0}, depends_on=[ids["sleep"]])
    return {reason: str(task_id) for reason, task_id in ids.items()}

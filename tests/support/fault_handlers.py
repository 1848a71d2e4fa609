"""Handlers for the database-fault tests of tests/reliability/, which count executions without a
database connection of the handler's own: a handler whose bookkeeping connection breaks in a
fault would fail and be retried, a rerun that no reclaim explains.

- t.noted appends its task id to a file of its process under $SKIPLOCK_TEST_EXECUTIONS_DIR;
- t.ledger writes public.ledger in its ctx.transaction(), committed with its outcome.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from skiplock import task

_lock = threading.Lock()


def executions(directory: Path) -> dict[str, int]:
    """{task id: executions} from every process's file under `directory`."""
    counts: dict[str, int] = {}
    for path in directory.glob("*.ids"):
        for line in path.read_text().split():
            counts[line] = counts.get(line, 0) + 1
    return counts


@task("t.noted")
def noted(ctx, payload):
    path = Path(os.environ["SKIPLOCK_TEST_EXECUTIONS_DIR"]) / f"{os.getpid()}.ids"
    with _lock, open(path, "a") as out:
        out.write(f"{ctx.task_id}\n")
    time.sleep(float(payload.get("sleep", 0)))
    return None


@task("t.ledger", max_attempts=10, retry_base=0.05, retry_cap=0.5)
def ledger(ctx, payload):
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO public.ledger (task_id, amount) VALUES (%s, 1)", (ctx.task_id,))
        time.sleep(float(payload.get("sleep", 0)))
    return None

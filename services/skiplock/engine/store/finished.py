"""Waiting for a task to be final (skiplock.wait): LISTEN on skiplock_<schema>_finished (the
tasks_watched trigger of migration 0017 notifies it with the task's id when a watched task ends;
on the distributed placement the store's walk does, store/routed_graph.py),
mark the task watched, and read it when a notification names it, or every `poll` seconds in case
one was missed (notifications sent while the connection was busy are kept for it; those lost with
a dropped connection are not). It never polls faster than that.
"""

from __future__ import annotations

import time
import uuid

import psycopg
from psycopg import sql as pgsql

from .. import queries
from ..errors import TaskNotFound, WaitTimeout
from ..model import FINISHED_STATES, Task
from .plans import _run
from .task_inserts import placement_plan
from .rows import rows_as
from .translation import translated_errors


def wait_finished(conn: psycopg.Connection, schema: str, task_id: uuid.UUID, timeout: float,
                  poll: float) -> Task:
    """The task once final, read on `conn` (autocommit); WaitTimeout after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    statements = queries.load(schema)
    channel = pgsql.Identifier(f"skiplock_{schema}_finished")
    wanted = str(task_id)
    with translated_errors(conn):
        conn.execute(pgsql.SQL("LISTEN {}").format(channel))
        try:
            distributed = _run(conn, placement_plan(conn, schema))  # read once per database
            state = (_routed_watch if distributed else _watch)(conn, statements, schema, task_id)
            if state is None:
                raise TaskNotFound(f"task {task_id} not found")
            while state not in FINISHED_STATES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(f"task {task_id} is still {state} after {timeout:g} s")
                for notice in conn.notifies(timeout=min(remaining, poll)):
                    if notice.payload == wanted:
                        break
                row = conn.execute(statements["task_state"], {"id": task_id}).fetchone()
                if row is None:
                    raise TaskNotFound(f"task {task_id} not found (deleted while waited for)")
                state = row[0]
            get = "routed_task_get" if distributed else "task_get"
            (task,) = rows_as(get, Task, conn.execute(statements[get], {"id": task_id}))
            return task
        finally:
            conn.execute(pgsql.SQL("UNLISTEN {}").format(channel))


def _watch(conn: psycopg.Connection, statements, schema: str, task_id: uuid.UUID) -> str | None:
    """Mark the task watched; its state now (None: no such task)."""
    row = conn.execute(statements["task_watch"], {"id": task_id, "channel": f"skiplock_{schema}"}).fetchone()
    return None if row is None else row[0]


def _routed_watch(conn: psycopg.Connection, statements, schema: str, task_id: uuid.UUID) -> str | None:
    """_watch on the distributed placement (store/routed_graph.py sends the notification): the
    task's queue read first, then its row marked on its shard."""
    found = conn.execute(statements["routed_task_queues"], {"ids": [task_id]}).fetchall()
    if not found:
        return None
    [(_, queue)] = found
    with conn.transaction():
        row = conn.execute(statements["routed_task_watch"], {"queue": queue, "id": task_id}).fetchone()
        if row is not None and row[0] == "queued":  # a claim that skipped the row looks again
            conn.execute(statements["routed_wake"], {"channel": f"skiplock_{schema}", "queues": [queue]})
    return None if row is None else row[0]

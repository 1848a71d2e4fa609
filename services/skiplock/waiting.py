"""skiplock.wait: block until a task is final (completed, failed or cancelled) and return it.
How it waits (LISTEN, with a read every POLL_SECONDS as the fallback): engine/store/finished.py.
"""

from __future__ import annotations

import uuid

from .engine import store as store_mod
from .engine.errors import InvalidInput
from .engine.model import Task
from .engine.store.finished import wait_finished
from .enqueueing import _pooler, _schema

# the fallback read while no notification came
POLL_SECONDS = 1.0


def wait(conn_or_url: store_mod.Connection | str, task_id: uuid.UUID | str, timeout: float, *,
         schema: str | None = None) -> Task:
    """The task once it is final; raises WaitTimeout (a TimeoutError) after `timeout` seconds, and
    TaskNotFound for an id that names no task. A connection must be in autocommit mode
    (notifications arrive between transactions); a URL opens one of its own."""
    schema = _schema(schema)
    try:
        task_id = task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id))
    except ValueError:
        raise InvalidInput(f"task id {task_id!r}: not a UUID") from None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout >= 0:
        raise InvalidInput(f"timeout {timeout!r}: must be a number of seconds >= 0")
    if isinstance(conn_or_url, str):
        with store_mod.connect(conn_or_url, autocommit=True, pooler=_pooler()) as conn:
            return _wait(conn, schema, task_id, timeout)
    if not isinstance(conn_or_url, store_mod.Connection):
        raise InvalidInput("wait needs a psycopg Connection or a postgresql:// URL")
    if not conn_or_url.autocommit:
        raise InvalidInput("wait needs a connection in autocommit mode (notifications arrive between "
                           "transactions), or a URL")
    return _wait(conn_or_url, schema, task_id, timeout)


def _wait(conn, schema: str, task_id: uuid.UUID, timeout: float) -> Task:
    store_mod.schema_check(conn, schema)
    return wait_finished(conn, schema, task_id, timeout, POLL_SECONDS)

"""What the worker's parts catch when a statement fails: skiplock's own errors, never the driver's.

The store's methods translate psycopg errors themselves; `translated` (the store's translation)
covers what the worker does on a handler's own connection (ctx.transaction()): its commit,
rollback and return to the pool.
"""

from __future__ import annotations

from ..engine.errors import DatabaseError, DatabaseUnavailable
from ..engine.store import translated_errors

# connection trouble, or a statement Postgres refused: retried with backoff, or (a refused
# value) failed task by task
DB_ERRORS = (DatabaseUnavailable, DatabaseError)

translated = translated_errors()


def short(exc: BaseException) -> str:
    """An error's first line, for a log record."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]

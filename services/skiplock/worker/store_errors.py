"""What the worker's parts catch when a statement fails: skiplock's own errors, never the driver's.

The store's methods translate psycopg errors themselves; `translated` (the store's translation)
covers what the worker does on a handler's own connection (ctx.transaction()): its commit,
rollback and return to the pool.
"""

from __future__ import annotations

import logging

from ..engine.errors import DatabaseError, DatabaseUnavailable
from ..engine.outage import OUTAGE
from ..engine.store import translated_errors

# connection trouble, or a statement Postgres refused: retried with backoff, or (a refused
# value) failed task by task
DB_ERRORS = (DatabaseUnavailable, DatabaseError)

translated = translated_errors()


def short(exc: BaseException) -> str:
    """An error's first line, for a log record."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def failed(log: logging.Logger, message: str, where: str, exc: BaseException, **extra) -> None:
    """A statement of `where` failed: connection trouble is the outage's to say (one line for
    all the worker's paths, engine/outage.py); a statement Postgres refused is logged here."""
    if isinstance(exc, DatabaseUnavailable):
        OUTAGE.failed(where, short(exc))
    else:
        log.warning(message, extra={"error": short(exc), **extra})

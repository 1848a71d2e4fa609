"""What the worker's parts catch when a statement fails: skiplock's own errors, never the driver's.

The store turns every psycopg error into a skiplock error. `translated` does the same for the
statements the worker runs itself, on the connection a handler opened with ctx.transaction(),
and for any store call that still lets a driver error through.
"""

from __future__ import annotations

import psycopg

from ..engine.errors import DatabaseError, DatabaseUnavailable, DataRefused

# connection trouble, or a statement Postgres refused: retried with backoff, or (a refused
# value) failed task by task
DB_ERRORS = (DatabaseUnavailable, DatabaseError)


class _Translated:
    """`with translated:` re-raises a psycopg error as the skiplock error of its condition."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or not isinstance(exc, psycopg.Error):
            return False
        if isinstance(exc, psycopg.OperationalError):
            raise DatabaseUnavailable(short(exc)) from exc
        if isinstance(exc, psycopg.DataError):
            raise DataRefused(short(exc)) from exc
        raise DatabaseError(short(exc)) from exc


translated = _Translated()


def short(exc: BaseException) -> str:
    """An error's first line, for a log record."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


"""Every psycopg error as a skiplock error: what the store's callers catch instead of the driver's.

It runs no statement; it must not decide what an error means for a task (the roles do).
"""

from __future__ import annotations

import psycopg

from ..errors import (ConnectionLost, DatabaseError, DatabaseUnavailable, DataRefused, MigrationError,
                      StatementTimeout)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# SQLSTATEs of a server that ends the session: admin_shutdown (pg_terminate_backend, a fast or
# smart shutdown) and crash_shutdown (another backend crashed)
_ENDED_BY_SERVER = frozenset({"57P01", "57P02"})


class _Translated:
    """Every psycopg error as a skiplock error (`raise ... from exc`, so the driver's stays the
    cause): a database whose skiplock schema was never migrated; a cancelled statement; a
    connection the server ended or that broke while in use (ConnectionLost); a refused
    connection, and every other operational error (a lock timeout, a deadlock, a serialization
    failure: try again); a value the database refuses; anything else (a bug of ours). A class,
    not a generator: the worker enters it around every claim and settle, and one shared instance
    costs no allocation."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def _lost(self, exc: psycopg.OperationalError) -> bool:
        return exc.sqlstate in _ENDED_BY_SERVER

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or not isinstance(exc, psycopg.Error):
            return False
        if isinstance(exc, (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)):
            raise MigrationError(f"the skiplock schema is missing ({_first_line(exc)}): "
                                 "run `skiplock migrate`") from exc
        if isinstance(exc, psycopg.errors.QueryCanceled):  # statement_timeout, or pg_cancel_backend
            raise StatementTimeout(f"the database cancelled the statement: {_first_line(exc)}") from exc
        if isinstance(exc, psycopg.OperationalError):
            kind = ConnectionLost if self._lost(exc) else DatabaseUnavailable
            raise kind(str(exc).strip() or type(exc).__name__) from exc
        if isinstance(exc, psycopg.DataError):
            raise DataRefused(_first_line(exc)) from exc
        # IntegrityError, ProgrammingError, InternalError, InterfaceError, ...
        raise DatabaseError(_first_line(exc)) from exc


_TRANSLATED = _Translated()


class TranslatedOn(_Translated):
    """The translation around a pooled connection, which also knows a connection that broke
    without a word from the server (a reset, an end of stream) by the connection's state."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: psycopg.Connection | None = None

    def __enter__(self) -> "TranslatedOn":
        return self

    def _lost(self, exc: psycopg.OperationalError) -> bool:
        return super()._lost(exc) or (self.conn is not None and self.conn.broken)


def translated_errors(conn: psycopg.Connection | None = None) -> _Translated:
    """`with translated_errors():` turns a psycopg error raised inside into a skiplock error.
    Given the connection the statements inside run on, a connection that broke without a word
    from the server is a ConnectionLost too (without it, only one the server ended)."""
    if conn is None:
        return _TRANSLATED
    translation = TranslatedOn()
    translation.conn = conn
    return translation

"""A handler's own transaction (`ctx.transaction()`): one pooled connection, held from the
handler's first use until its outcome is written on it, then committed or rolled back and given
back to the pool.

The handler's thread opens it (TaskContext) and ends it (Completer.accept runs on that thread
too). An ExitStack holds the pool's loan, so giving the connection back is one `close()` of the
stack, wherever the handler's code left off, and never a hand-called `__exit__`.
"""

from __future__ import annotations

from contextlib import ExitStack

from ..engine.store import wait_unbounded
from .store_errors import DB_ERRORS, translated


class HeldTransaction:
    __slots__ = ("conn", "_loan")

    def __init__(self, store):
        loan = ExitStack()
        conn = loan.enter_context(store.connection())
        try:
            wait_unbounded(conn)  # the handler's statements take as long as they take
            conn.autocommit = False
        except BaseException:
            loan.close()
            raise
        self.conn = conn  # the store's psycopg connection, which the handler writes on
        self._loan = loan

    def release(self) -> None:
        """Give the connection back to the pool (after its commit or rollback); a pool that cannot
        take it back replaces it."""
        try:
            with translated:
                self._loan.close()
        except DB_ERRORS:
            pass

    def rollback(self, close: bool = False) -> None:
        """Undo the handler's writes and give the connection back; one that will not roll back
        (or `close`: one whose state is in doubt) is closed, not reused."""
        try:
            with translated:
                self.conn.rollback()
        except DB_ERRORS:
            close = True
        if close:
            try:
                with translated:
                    self.conn.close()
            except DB_ERRORS:
                pass
        self.release()

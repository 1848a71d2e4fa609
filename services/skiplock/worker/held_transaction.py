"""A handler's own transaction (`ctx.transaction()`): one pooled connection, held from the
handler's first use until its outcome is written on it, then committed or rolled back and given
back to the pool.

The handler's thread opens it (TaskContext) and ends it (Completer.accept runs on that thread
too). An ExitStack holds the pool's loan, so giving the connection back is one `close()` of the
stack, wherever the handler's code left off, and never a hand-called `__exit__`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack

from ..engine.errors import DatabaseUnavailable
from ..engine.model import BUSY, Settlement
from ..engine.store import wait_unbounded
from .store_errors import DB_ERRORS, translated

# The transaction stays open while its outcome is written again: the pauses between its attempts;
# still BUSY after the last, it is rolled back and retried.
_PAUSES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


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

    def settle(self, store, outcome: Settlement, on_busy: Callable[[], None]) -> dict[uuid.UUID, str]:
        """task_settle of `outcome` on this transaction, written again while its row is BUSY."""
        for pause in _PAUSES:
            applied = store.tasks.task_settle([outcome], conn=self.conn)
            if applied.get(outcome.task_id) != BUSY:
                return applied
            on_busy()
            time.sleep(pause)
        raise DatabaseUnavailable("the task's row stayed held by another transaction")

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

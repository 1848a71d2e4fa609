"""The reply timeout of the roles' connections: a connection that waits for each answer of
Postgres a bounded time, and the handler's own transaction, which may wait as long as it takes.

It decides nothing about what the caller does next: the caller sees a DatabaseUnavailable.
"""

from __future__ import annotations

import psycopg


# how long a connection that gives up waiting tries to have its statement cancelled
_CANCEL_SECONDS = 1.0


class AnsweringConnection(psycopg.Connection):
    """A connection that waits for each answer of Postgres at most `reply_timeout` seconds (None:
    as long as it takes). TCP keepalives and tcp_user_timeout catch a peer that is gone, but not
    a path that still acknowledges and forwards nothing: a hung proxy or pooler in between, which
    a role would wait on forever. After the timeout the statement is cancelled and the connection
    closed (it is mid-exchange and cannot be resumed), and the caller sees a DatabaseUnavailable."""

    reply_timeout: float | None = None

    def wait(self, gen, interval: float = 0.1, timeout: float | None = None):
        bound = self.reply_timeout
        if timeout is not None or bound is None:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, bound)
        except psycopg.errors._WaitTimeout:  # psycopg's own "no answer in time" (notifies() uses it)
            # The statement may still be running on a server that is only slow, holding its row
            # locks and its snapshot after the socket is closed: Postgres notices a client that
            # left only when it next writes to it. Ask it to cancel, briefly (on a silent path the
            # request goes unanswered too).
            try:
                self.cancel_safe(timeout=_CANCEL_SECONDS)
            except (psycopg.Error, OSError):
                pass
            self.pgconn.finish()
            raise psycopg.OperationalError(f"Postgres did not answer within {bound:g} s; the connection is "
                                           "closed (a network path to it that went silent?)") from None


def wait_unbounded(conn: psycopg.Connection) -> None:
    """Let `conn` wait for Postgres as long as it takes until it is back in its pool: a handler's
    own transaction, whose statements may legitimately run long."""
    conn.reply_timeout = None


def bounded_again(conn: psycopg.Connection) -> None:
    """A connection back in its pool: its class's reply timeout again."""
    conn.__dict__.pop("reply_timeout", None)

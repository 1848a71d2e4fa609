"""The store's connection pools and borrowing from them: a pool that remembers why its last
connection attempt failed, a borrower that asks again in slices (so a role is back soon after a
failover) and never lends a connection the server ended while it sat idle.

It runs no statement; Database (database.py) builds the pools and lends their connections.
"""

from __future__ import annotations

import select
import time
from contextlib import ExitStack

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import DatabaseUnavailable


# How long one wait for a pooled connection lasts before the pool is asked again. A pool whose
# connections all broke (a failover, a restart) replaces them in the background, once each: an
# attempt that fails while no server accepts writes is not retried, and a caller already waiting
# would wait out its whole timeout after the new primary is up. Asking again starts a new attempt,
# so a role is back within about this long of the database accepting connections.
_BORROW_SLICE = 0.5


def borrow(lent: ExitStack, pool: Pool, timeout: float, exhausted: dict[str, int]
           ) -> psycopg.Connection:
    """A connection of `pool`, returned when `lent` closes; waits up to `timeout` in slices.
    A borrower that gives up is counted in `exhausted` and told what the pool holds. A
    connection whose server ended it while it sat in the pool is given back (the pool replaces
    it) and another one taken."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        attempt = ExitStack()
        try:
            conn = attempt.enter_context(pool.connection(timeout=max(0.001, min(_BORROW_SLICE, remaining))))
        except PoolTimeout as exc:
            if pool.waits_ended:
                raise DatabaseUnavailable(f"stopped waiting for a connection of pool {pool.name!r}: "
                                          "its user is stopping") from exc
            if remaining <= _BORROW_SLICE:
                exhausted[pool.name] = exhausted.get(pool.name, 0) + 1
                raise DatabaseUnavailable(_exhausted_message(pool, timeout)) from exc
            continue
        if _ended_while_idle(conn):
            attempt.close()
            continue
        lent.enter_context(attempt)
        return conn


def _ended_while_idle(conn: psycopg.Connection) -> bool:
    """Whether the server ended `conn` while it sat idle in its pool (pg_terminate_backend, an
    idle-session timeout, a restart): the server said so and closed its end, but the client
    learns it only when it next reads. Handed out as it is, the unit of work that borrowed it
    fails on its first statement, and its role backs off as if the database were down. An idle
    connection has nothing to read, so the check is one poll of its socket, no round trip; only
    when something arrived does it read it. The server's farewell is a FATAL error, which libpq
    hands to the notice handlers on an idle connection; the end of the stream may come a moment
    after it, so the farewell alone settles it."""
    pgconn = conn.pgconn
    if pgconn.status == psycopg.pq.ConnStatus.OK:
        waiting = select.poll()  # not select(): a process may have descriptors past FD_SETSIZE
        waiting.register(pgconn.socket, select.POLLIN)
        if not waiting.poll(0):
            return False
        severities: list[str | None] = []

        def heard(diagnostic: psycopg.errors.Diagnostic) -> None:
            severities.append(diagnostic.severity_nonlocalized or diagnostic.severity)

        conn.add_notice_handler(heard)
        try:
            pgconn.consume_input()  # reads what arrived,
            pgconn.is_busy()  # and parses it: the farewell goes to the notice handlers
        except (psycopg.OperationalError, OSError):
            pass
        finally:
            conn.remove_notice_handler(heard)
        if pgconn.status == psycopg.pq.ConnStatus.OK and not {"FATAL", "PANIC"} & set(severities):
            return False  # a notice, or a parameter's new value: the connection is fine
    conn.close()  # the pool discards a closed connection it is given back, and opens another
    return True


def _exhausted_message(pool: ConnectionPool, timeout: float) -> str:
    """Why no connection came: every one lent out, or Postgres refusing more (its words)."""
    stats = pool.get_stats()
    text = (f"no database connection available within {timeout:g} s: pool {pool.name!r} holds "
            f"{stats.get('pool_size', 0)} of at most {pool.max_size}, none free")
    if pool.last_connect_error and stats.get("pool_size", 0) < pool.max_size:
        text += f"; opening another failed: {pool.last_connect_error}"
    return text


class Pool(ConnectionPool):
    """A ConnectionPool that keeps the reason of its last failed connection attempt, for the
    error a borrower that gives up sees ("too many clients already" names the cause; a pool
    timeout alone does not). psycopg_pool logs the attempt, but not where a handler's error is."""

    last_connect_error: str | None = None
    # set once no borrower should wait any more (end_claim_waits): a waiting one gives up within
    # a slice of borrow, one that finds a connection free still takes it
    waits_ended: bool = False

    def _connect(self, timeout: float | None = None):
        try:
            conn = super()._connect(timeout)
        except psycopg.Error as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            self.last_connect_error = (lines[-1] if lines else type(exc).__name__).strip()[:300]
            raise
        self.last_connect_error = None
        return conn

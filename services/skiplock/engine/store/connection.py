"""The connection and transaction layer of the store: pools, one-off connections, the
translation of every psycopg error into a skiplock error, and rows into row types by column name.

It runs no statement of its own choosing (the table groups do); it must not decide anything
about tasks, schedules or webhooks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import select
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
import psycopg.adapt
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import queries
from ..errors import (ConnectionLost, DatabaseError, DatabaseUnavailable, DataRefused, MigrationError,
                      StatementTimeout)
from ..settings import POOLERS

log = logging.getLogger("skiplock.store")

# libpq keepalives: a silently dead peer (half-open TCP) is noticed in about a minute. A path that
# still acknowledges but forwards nothing (a hung proxy) needs the roles' reply timeout as well
# (AnsweringConnection).
KEEPALIVES = dict(keepalives=1, keepalives_idle=20, keepalives_interval=5, keepalives_count=3,
                  tcp_user_timeout=30_000)


def pooler_options(pooler: str) -> dict:
    """The psycopg connection options for `pooler` (SKIPLOCK_DATABASE_POOLER). Behind a pooler in
    transaction mode (PgBouncer's pool_mode=transaction), consecutive transactions of one client
    connection may run on different server connections, so nothing may outlive a transaction: no
    server-side prepared statement (psycopg prepares a query from its prepare_threshold-th use, and
    the next transaction's server has never seen it), no session setting, no LISTEN."""
    return {"prepare_threshold": None} if pooler == "transaction" else {}


def connect(url: str, *, autocommit: bool = True, pooler: str = "none", **kwargs) -> psycopg.Connection:
    """A connection of our own (listener, migrations, one-off enqueue)."""
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=10, **KEEPALIVES,
                               **pooler_options(pooler), **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}".strip()) from exc


async def connect_async(url: str, *, autocommit: bool = True, pooler: str = "none") -> psycopg.AsyncConnection:
    """connect(), for asyncio (a one-off enqueue_async)."""
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=autocommit, connect_timeout=10, **KEEPALIVES,
                                                     **pooler_options(pooler))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}".strip()) from exc


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


class _TranslatedOn(_Translated):
    """The translation around a pooled connection, which also knows a connection that broke
    without a word from the server (a reset, an end of stream) by the connection's state."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: psycopg.Connection | None = None

    def __enter__(self) -> "_TranslatedOn":
        return self

    def _lost(self, exc: psycopg.OperationalError) -> bool:
        return super()._lost(exc) or (self.conn is not None and self.conn.broken)


def translated_errors(conn: psycopg.Connection | None = None) -> _Translated:
    """`with translated_errors():` turns a psycopg error raised inside into a skiplock error.
    Given the connection the statements inside run on, a connection that broke without a word
    from the server is a ConnectionLost too (without it, only one the server ended)."""
    if conn is None:
        return _TRANSLATED
    translation = _TranslatedOn()
    translation.conn = conn
    return translation


def use_generic_plans(conn: psycopg.Connection) -> None:
    """The worker's claim and settle statements (task_claim, task_settle) are built so
    that their best plan does not depend on their parameters or on the table's size: per-row
    primary-key probes, an ordered scan of tasks_claimable, a TID scan. Left to itself, Postgres
    plans them anew on every call (with an unknown LIMIT, the generic plan's estimate looks worse
    than the custom plans'), and planning is a large share of its CPU per task in a drain. So on
    these connections, which run only those statements, each is planned once (psycopg prepares
    it from its sixth use), without hash or merge joins or sequential scans, so that a plan made
    while the table was small stays right when it is large. tests/integration/test_claims.py
    checks the plans.

    And without JIT compilation: a sequential scan that no index can replace (the triggers' scans
    of their transition tables and of webhook_endpoints, when an endpoint is enabled) still runs,
    at the cost of 10^10 that enable_seqscan = off gives it, which is far past jit_above_cost, so
    Postgres would compile, inline and optimize each trigger's statement on every claim and every
    settle: hundreds of milliseconds each, for statements that run in one or two."""
    conn.execute("SET plan_cache_mode = force_generic_plan; SET enable_hashjoin = off; "
                 "SET enable_mergejoin = off; SET enable_seqscan = off; SET jit = off")


class JsonbLoader(psycopg.adapt.Loader):
    """jsonb text to Python, straight through json's C scanner: json.loads() spends most of its
    time on a small payload checking its argument and detecting the bytes' encoding. Used on the
    claims connection, which loads one payload per claimed task."""

    _scan = json.decoder.JSONDecoder().scan_once  # the C scanner, where there is one

    def load(self, data: Any) -> Any:
        text = str(data, "utf-8")
        try:
            value, end = self._scan(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):  # not one whole JSON value (never from Postgres): json says why
            return json.loads(text)
        return value


# ---- rows into row types, by column name ------------------------------------------------------

def row_fields(row_type: type) -> tuple[str, ...]:
    """The fields of a row type (a NamedTuple or a dataclass), in order."""
    fields = getattr(row_type, "_fields", None)
    if fields is not None:
        return tuple(fields)
    return tuple(f.name for f in dataclasses.fields(row_type))


def _required(row_type: type) -> set[str]:
    defaults = getattr(row_type, "_field_defaults", None)
    if defaults is not None:
        return set(row_type._fields) - set(defaults)
    return {f.name for f in dataclasses.fields(row_type)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def row_maker(statement: str, row_type: type, columns: Sequence[str]) -> Callable[[tuple], Any]:
    """Build one row of `row_type` from one row of `statement`, matching columns to fields by
    name; raises TypeError naming the statement when they do not fit. Columns in the order of
    the fields (every statement today) are passed by position: no per-row cost over a tuple."""
    fields, columns = row_fields(row_type), tuple(columns)
    unknown = [c for c in columns if c not in fields]
    missing = _required(row_type) - set(columns)
    if unknown or missing or len(set(columns)) != len(columns):
        raise TypeError(f"statement {statement!r} returns columns {list(columns)}, which do not fill "
                        f"{row_type.__name__}{list(fields)}")
    if columns == fields[:len(columns)]:
        if columns == fields and hasattr(row_type, "_make"):
            return row_type._make
        return lambda row: row_type(*row)
    return lambda row: row_type(**dict(zip(columns, row)))


# {(statement, row type): maker}: built from the first result's description, then reused
_MAKERS: dict[tuple[str, type], Callable[[tuple], Any]] = {}


def rows_as(statement: str, row_type: type, cursor: psycopg.Cursor) -> list:
    """All rows of `cursor` (which ran `statement`) as `row_type`."""
    rows = cursor.fetchall()
    make = _MAKERS.get((statement, row_type))
    if make is None:
        make = _MAKERS[statement, row_type] = row_maker(statement, row_type,
                                                        [c.name for c in cursor.description])
    return list(map(make, rows))


# ---- pools and transactions -------------------------------------------------------------------

def _set_statement_timeout(milliseconds: int, conn: psycopg.Connection) -> None:
    conn.execute(f"SET statement_timeout = {int(milliseconds)}")


# How long one wait for a pooled connection lasts before the pool is asked again. A pool whose
# connections all broke (a failover, a restart) replaces them in the background, once each: an
# attempt that fails while no server accepts writes is not retried, and a caller already waiting
# would wait out its whole timeout after the new primary is up. Asking again starts a new attempt,
# so a role is back within about this long of the database accepting connections.
_BORROW_SLICE = 0.5


def _borrow(lent: ExitStack, pool: _Pool, timeout: float, exhausted: dict[str, int]
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


def _bounded_again(conn: psycopg.Connection) -> None:
    """A connection back in its pool: its class's reply timeout again."""
    conn.__dict__.pop("reply_timeout", None)


class _Pool(ConnectionPool):
    """A ConnectionPool that keeps the reason of its last failed connection attempt, for the
    error a borrower that gives up sees ("too many clients already" names the cause; a pool
    timeout alone does not). psycopg_pool logs the attempt, but not where a handler's error is."""

    last_connect_error: str | None = None
    # set once no borrower should wait any more (end_claim_waits): a waiting one gives up within
    # a slice of _borrow, one that finds a connection free still takes it
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


class Database:
    """Pooled connections for one schema. Thread-safe: each call borrows a connection. Creating
    one opens nothing; `open()` starts the pools."""

    def __init__(self, url: str, schema: str = "skiplock", *, min_size: int = 1, max_size: int = 8,
                 name: str = "skiplock", worker_connections: bool = False, statement_timeout: float | None = None,
                 pooler: str = "none", reply_timeout: float | None = None, borrow_timeout: float = 15.0):
        """`worker_connections`: give task_claim and task_settle a connection each of their own
        (a worker claims on one while its writer writes outcomes on the other), on which those
        statements run with generic plans (see use_generic_plans). Without: they share the pool.
        `statement_timeout` (seconds): Postgres cancels a statement of the pool's that runs longer
        (StatementTimeout); None leaves the server's setting. `pooler` (one of POOLERS): behind a
        transaction pooler no statement is prepared and no session setting is made, so neither
        generic plans nor the statement timeout apply (the timeout is then the database role's).
        `reply_timeout` (seconds): the longest wait for one answer of Postgres before the
        connection is given up (AnsweringConnection); None: as long as TCP keeps it.
        `borrow_timeout` (seconds): the longest a caller waits for a pooled connection (the API's
        replica gives up soon and reads from the primary instead)."""
        if pooler not in POOLERS:
            raise ValueError(f"pooler {pooler!r}: must be one of {', '.join(POOLERS)}")
        self.url = url
        self.schema = schema
        self.channel = f"skiplock_{schema}"
        self.sql = queries.load(schema)
        self.pooler = pooler
        kwargs = dict(autocommit=True, connect_timeout=10, application_name=f"skiplock-{name}", **KEEPALIVES,
                      **pooler_options(pooler))
        configure = None
        if statement_timeout is not None and pooler == "transaction":
            # a SET would stay on whichever server connection ran it, for other clients to inherit
            log.warning("behind a transaction pooler the statement timeout is not set per session: set it "
                        "on the database role instead (ALTER ROLE ... SET statement_timeout)",
                        extra={"pool": name, "statement_timeout_seconds": statement_timeout})
        elif statement_timeout is not None:
            # set per session when the pool connects, not in the URL's options, which it may carry
            milliseconds = max(1, round(statement_timeout * 1000))
            configure = functools.partial(_set_statement_timeout, milliseconds)
        answering = type("AnsweringConnection", (AnsweringConnection,), {"reply_timeout": reply_timeout})
        self.pool: ConnectionPool | None = _Pool(
            url, min_size=min_size, max_size=max_size, open=False, name=name, timeout=borrow_timeout, kwargs=kwargs,
            reconnect_timeout=0, configure=configure, connection_class=answering, reset=_bounded_again)
        self.claim_pool = self.outcome_pool = None
        self.exhausted: dict[str, int] = {}  # by pool name: borrowers that gave up (pool_stats)
        if worker_connections:
            self.claim_pool, self.outcome_pool = (
                _Pool(url, min_size=1, max_size=1, open=False, name=f"{name}-{use}", timeout=15,
                               reconnect_timeout=0, configure=functools.partial(self._configure_worker_connection, use),
                               num_workers=1, kwargs={**kwargs, "application_name": f"skiplock-{name}-{use}"},
                               connection_class=answering)
                for use in ("claims", "outcomes"))

    def _configure_worker_connection(self, use: str, conn: psycopg.Connection) -> None:
        """A new claims or outcomes connection: generic plans, then one run of its statement that
        touches nothing (a claim of 0 tasks; the outcome of a task that does not exist). A new
        backend's first run of one of these statements reads its catalogs and plans it, which
        costs milliseconds (tests/benchmarks/RESULTS.md). Done in the pool's thread while the
        worker starts (and after a reconnect, before the connection is lent), it is off the
        first claim's path. Behind a transaction pooler, neither: the settings would not stay
        with this connection, and the planning a warm-up saves is done again on every call."""
        if self.pooler == "transaction":
            if use == "claims":
                conn.adapters.register_loader("jsonb", JsonbLoader)
            return
        use_generic_plans(conn)
        if use == "claims":
            conn.adapters.register_loader("jsonb", JsonbLoader)
            statement, params = "task_claim", dict(queues=["default"], limit=0, owner="", lease_seconds=1.0,
                                                   kind_max_attempts=None, park_limit=0, lanes=0)
        else:
            from ..model import uuid7
            statement = "task_settle"
            params = {"settlements": Jsonb([{"id": uuid7().hex, "token": 0, "outcome": "completed"}])}
        try:
            conn.execute(self.sql[statement], params)
        except psycopg.DatabaseError as exc:  # not fatal: the real statement will say what is wrong
            log.debug("warming up the %s connection failed", use, extra={"error": str(exc)})

    def _pools(self) -> list[ConnectionPool]:
        return [p for p in (self.claim_pool, self.outcome_pool, self.pool) if p is not None]

    def end_claim_waits(self) -> None:
        """A stopping worker claims nothing more: a claim waiting for the claims connection (all
        of the database's connection slots taken, say) gives up now instead of at its timeout,
        so the drain does not wait for it. Outcomes and heartbeats still wait as before. Without
        worker connections, claims share the pool with everything else: nothing changes."""
        if self.claim_pool is not None:
            self.claim_pool.waits_ended = True

    def pool_stats(self) -> dict[str, dict[str, int]]:
        """Each pool's figures by its name: psycopg_pool's get_stats(), and `exhausted`, the
        borrowers that gave up waiting (the pool metrics, engine/metrics.py)."""
        return {p.name: {**p.get_stats(), "exhausted": self.exhausted.get(p.name, 0)} for p in self._pools()}

    def open(self, wait: bool = False) -> None:
        for pool in reversed(self._pools()):
            pool.open(wait=wait, timeout=15)

    def close(self) -> None:
        for pool in self._pools():
            pool.close(timeout=5)

    @contextmanager
    def connection(self, timeout: float | None = None, *, pool: ConnectionPool | None = None
                   ) -> Iterator[psycopg.Connection]:
        """Borrow a pooled connection (waiting up to `timeout`, default the pool's 15 s); every
        psycopg error inside surfaces as a skiplock error (see translated_errors)."""
        pool = pool or self.pool
        with ExitStack() as lent:
            translation = lent.enter_context(_TranslatedOn())
            conn = translation.conn = _borrow(lent, pool, pool.timeout if timeout is None else timeout,
                                              self.exhausted)
            yield conn

    def fetch(self, name: str, params: dict, *, pool: ConnectionPool | None = None,
              timeout: float | None = None) -> list[tuple]:
        """All rows of statement `name`, as tuples; `timeout`: the longest wait for a connection
        (default the pool's)."""
        with self.connection(timeout, pool=pool) as conn:
            return conn.execute(self.sql[name], params).fetchall()

    def fetch_as(self, name: str, params: dict, row_type: type, *, pool: ConnectionPool | None = None) -> list:
        """All rows of statement `name`, as `row_type` (by column name)."""
        with self.connection(pool=pool) as conn:
            return rows_as(name, row_type, conn.execute(self.sql[name], params))

    @contextmanager
    def transaction(self) -> Iterator["BoundDatabase"]:
        """One connection in one transaction that commits when the block ends (rolls back if it
        raises). On a bound database, a savepoint of the transaction it is in."""
        with self.connection() as conn, conn.transaction():
            yield BoundDatabase(self, conn)

    @contextmanager
    def unit(self) -> Iterator[psycopg.Connection]:
        """A connection on which several statements run as one: in a transaction of their own,
        or in the caller's when this database is bound to one."""
        with self.connection() as conn, conn.transaction():
            yield conn


class BoundDatabase(Database):
    """The database `Database.transaction()` yields: every call runs on the one connection it holds."""

    def __init__(self, parent: Database, conn: psycopg.Connection):
        # not super().__init__(): that would build a second pool; share the parent's state
        self.__dict__.update(parent.__dict__)
        self.conn = conn
        self.pool = self.claim_pool = self.outcome_pool = None

    @contextmanager
    def connection(self, timeout: float | None = None, *, pool: ConnectionPool | None = None
                   ) -> Iterator[psycopg.Connection]:
        with translated_errors(self.conn):
            yield self.conn

    @contextmanager
    def unit(self) -> Iterator[psycopg.Connection]:
        with translated_errors(self.conn):
            yield self.conn

    def open(self, wait: bool = False) -> None:
        raise TypeError("a transaction's store has no pool of its own")

    def close(self) -> None:
        raise TypeError("a transaction's store has no pool of its own")


def jsonb(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


# The driver's connection type, for callers that take a caller's connection (enqueue's public
# API) without importing the driver themselves.
Connection = psycopg.Connection
AsyncConnection = psycopg.AsyncConnection

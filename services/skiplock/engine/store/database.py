"""The store's pooled database for one schema (Database), and the one a transaction yields,
bound to its connection (BoundDatabase). BoundDatabase is a Database whose calls all run on one
connection, and Database.transaction() builds it: the two live together.

It runs no statement of its own choosing (the table groups do); it must not decide anything
about tasks, schedules or webhooks.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from .. import queries
from ..settings import POOLERS
from .connection import KEEPALIVES, JsonbLoader, pooler_options, use_generic_plans
from .pools import Pool, borrow
from .reply_timeout import AnsweringConnection, bounded_again
from .rows import rows_as
from .translation import TranslatedOn, translated_errors

log = logging.getLogger("skiplock.store")


def _set_statement_timeout(milliseconds: int, conn: psycopg.Connection) -> None:
    conn.execute(f"SET statement_timeout = {int(milliseconds)}")


def tasks_distributed(conn: psycopg.Connection, sql: Mapping[str, str]) -> bool:
    """Whether the schema's tasks table is distributed by Citus (engine/migrate.py, distribute)."""
    if not conn.execute(sql["placement_citus_catalog"]).fetchone()[0]:
        return False
    return bool(conn.execute(sql["placement_tasks_distributed"]).fetchone()[0])


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
        self.pool: ConnectionPool | None = Pool(
            url, min_size=min_size, max_size=max_size, open=False, name=name, timeout=borrow_timeout, kwargs=kwargs,
            reconnect_timeout=0, configure=configure, connection_class=answering, reset=bounded_again)
        self.claim_pool = self.outcome_pool = None
        self.exhausted: dict[str, int] = {}  # by pool name: borrowers that gave up (pool_stats)
        self._distributed: bool | None = None  # read from the database when first asked (distributed)
        if worker_connections:
            self.claim_pool, self.outcome_pool = (
                Pool(url, min_size=1, max_size=1, open=False, name=f"{name}-{use}", timeout=15,
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
        if self._distributed is None:
            self._distributed = tasks_distributed(conn, self.sql)
        if self.pooler == "transaction" or self._distributed:
            # on the distributed placement Citus plans each statement for the queue it names: a
            # generic plan cannot be routed ("could not create distributed plan")
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

    @property
    def distributed(self) -> bool:
        """Whether the schema's tasks are distributed over a Citus cluster (engine/migrate.py, distribute):
        the store then runs store/routed.py's statements. Read once; a placement is applied before
        the roles start, never under them."""
        if self._distributed is None:
            with self.connection() as conn:
                self._distributed = tasks_distributed(conn, self.sql)
        return self._distributed

    def _pools(self) -> list[ConnectionPool]:
        return [p for p in (self.claim_pool, self.outcome_pool, self.pool) if p is not None]

    def check_idle(self) -> None:
        """Test each pool's idle connections and replace the dead ones (after an outage: those
        that died with the server would otherwise fail the next borrower, one by one)."""
        for pool in self._pools():
            pool.check()

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
            translation = lent.enter_context(TranslatedOn())
            conn = translation.conn = borrow(lent, pool, pool.timeout if timeout is None else timeout,
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

"""How the store's connections are made: the options every one gets (keepalives; what a
transaction pooler rules out), one-off connections of our own, the settings and the jsonb loader
of the worker's claims and outcomes connections, and the driver's types that callers use without
importing the driver.

It runs no statement of its own choosing (the table groups do); it must not decide anything
about tasks, schedules or webhooks.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import psycopg.adapt
from psycopg.types.json import Jsonb

from ..errors import DatabaseUnavailable

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


def jsonb(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


# The driver's connection type, for callers that take a caller's connection (enqueue's public
# API) without importing the driver themselves.
Connection = psycopg.Connection
AsyncConnection = psycopg.AsyncConnection

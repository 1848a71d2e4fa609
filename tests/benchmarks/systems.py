"""One adapter per system, all with the same small interface.

An adapter knows only what differs between systems:

* ``setup()``: install the system's schema with the system's own installer (in the database
  named by ``$BENCH_DB_URL``);
* ``producer()``: an async context manager yielding an object with ``enqueue(payload)`` (one task
  per call, one transaction per call) and ``enqueue_many(payloads)`` (one call for many);
* ``worker_command(db_url, index)``: argv and extra environment of one real worker process;
* ``count_all_sql`` / ``count_done_sql`` / ``count_failed_sql`` / ``done_times_sql``: how to read
  progress from the DB.

Everything generic (databases, timing, subprocesses, timeouts, percentiles) lives in ``run.py``.
Library imports happen inside methods, so a system whose package is missing fails alone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

KIND = "bench.noop"
QUEUE = "default"


class Producer(Protocol):
    async def enqueue(self, payload: dict[str, Any]) -> None: ...

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None: ...


@dataclass
class WorkerSettings:
    """Knobs of each system's worker; the defaults are the ones the brief asks for."""

    pgqueuer_batch_size: int = 100
    procrastinate_concurrency: int = 10
    skiplock_concurrency: int = 10
    skiplock_claim_batch: int = 0  # 0: the engine's default (as many as free slots)
    raw_batch_size: int = 100


def _db_url() -> str:
    return os.environ["BENCH_DB_URL"]


@dataclass
class System:
    settings: WorkerSettings = field(default_factory=WorkerSettings)

    name: ClassVar[str]
    # Every task the system holds, whatever its state: checks that an enqueue phase really landed.
    count_all_sql: ClassVar[str]
    count_done_sql: ClassVar[str]
    count_failed_sql: ClassVar[str | None] = None
    # The epoch seconds of every completion as the system recorded it, so a drain's first and last
    # completion are exact rather than poll ticks.
    done_times_sql: ClassVar[str | None] = None

    def check_importable(self) -> None:
        """Raise if the system's library is not importable (the whole column becomes `error`)."""

    def describe(self) -> str:
        raise NotImplementedError

    async def setup(self) -> None:
        raise NotImplementedError

    def producer(self) -> Any:
        raise NotImplementedError

    def worker_command(self, db_url: str, index: int) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def api_command(self, db_url: str, bind: str, workers: int) -> tuple[list[str], dict[str, str]] | None:
        """argv and extra environment of the system's HTTP submission service; None: it has none
        (the API phase is skipped for it)."""
        return None


# --------------------------------------------------------------------------------------- raw


class _RawProducer:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def enqueue(self, payload: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO bench_tasks (kind, payload) VALUES (%s, %s::jsonb)",
            (KIND, json.dumps(payload)),
        )

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        self.conn.execute(
            "INSERT INTO bench_tasks (kind, payload) SELECT %s, p::jsonb FROM unnest(%s::text[]) p",
            (KIND, [json.dumps(p) for p in payloads]),
        )


@dataclass
class RawSystem(System):
    name: ClassVar[str] = "raw"
    count_all_sql: ClassVar[str] = "SELECT count(*) FROM bench_tasks"
    count_done_sql: ClassVar[str] = "SELECT count(*) FROM bench_tasks WHERE state = 'done'"
    done_times_sql: ClassVar[str | None] = (
        "SELECT extract(epoch FROM finished_at) FROM bench_tasks WHERE state = 'done'"
    )

    def describe(self) -> str:
        return (
            f"raw: plain table + psycopg 3 loop, claim LIMIT {self.settings.raw_batch_size} "
            "FOR UPDATE SKIP LOCKED in one statement, mark the batch done in one statement, "
            "LISTEN/NOTIFY (statement trigger) with 0.5 s fallback poll"
        )

    async def setup(self) -> None:
        import psycopg

        from tests.benchmarks.raw_worker import SCHEMA

        with psycopg.connect(_db_url(), autocommit=True) as conn:
            conn.execute(SCHEMA)

    @asynccontextmanager
    async def producer(self) -> AsyncIterator[Producer]:
        import psycopg

        with psycopg.connect(_db_url(), autocommit=True) as conn:
            yield _RawProducer(conn)

    def worker_command(self, db_url: str, index: int) -> tuple[list[str], dict[str, str]]:
        return (
            [sys.executable, "-m", "tests.benchmarks.raw_worker"],
            {"BENCH_RAW_BATCH": str(self.settings.raw_batch_size)},
        )


# ---------------------------------------------------------------------------------- pgqueuer


class _PgqProducer:
    def __init__(self, queries: Any) -> None:
        self.queries = queries

    async def enqueue(self, payload: dict[str, Any]) -> None:
        await self.queries.enqueue(KIND, json.dumps(payload).encode())

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        n = len(payloads)
        await self.queries.enqueue([KIND] * n, [json.dumps(p).encode() for p in payloads], [0] * n)


@dataclass
class PgQueuerSystem(System):
    name: ClassVar[str] = "pgqueuer"
    count_all_sql: ClassVar[str] = "SELECT count(*) FROM pgqueuer"
    # A finished job is deleted from `pgqueuer` and logged in `pgqueuer_log` with its final status.
    count_done_sql: ClassVar[str] = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    count_failed_sql: ClassVar[str | None] = (
        "SELECT count(*) FROM pgqueuer_log WHERE status IN ('exception', 'failed')"
    )
    done_times_sql: ClassVar[str | None] = (
        "SELECT extract(epoch FROM created) FROM pgqueuer_log WHERE status = 'successful'"
    )

    def check_importable(self) -> None:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401

    def describe(self) -> str:
        import pgqueuer

        return (
            f"pgqueuer {pgqueuer.__version__}: pgqueuer.run(tests.benchmarks.handlers_pgqueuer:create, "
            f"batch_size={self.settings.pgqueuer_batch_size}), i.e. what `pgq run --batch-size "
            f"{self.settings.pgqueuer_batch_size}` does (PgQueuer app, asyncpg driver, uvloop, "
            "async handler, no max-concurrent-tasks cap); schema via Queries.install(); "
            "enqueue via Queries.enqueue on one asyncpg connection"
        )

    @staticmethod
    async def _queries(conn: Any) -> Any:
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        return Queries(AsyncpgDriver(conn))

    async def setup(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(_db_url())
        try:
            await (await self._queries(conn)).install()
        finally:
            await conn.close()

    @asynccontextmanager
    async def producer(self) -> AsyncIterator[Producer]:
        import asyncpg

        conn = await asyncpg.connect(_db_url())
        try:
            yield _PgqProducer(await self._queries(conn))
        finally:
            await conn.close()

    def worker_command(self, db_url: str, index: int) -> tuple[list[str], dict[str, str]]:
        # `pgq run ... --batch-size N` through pgqueuer.run(); see pgqueuer_worker.py for why.
        return (
            [sys.executable, "-m", "tests.benchmarks.pgqueuer_worker"],
            {"BENCH_PGQ_BATCH": str(self.settings.pgqueuer_batch_size)},
        )


# ----------------------------------------------------------------------------- procrastinate


class _ProcrastinateProducer:
    def __init__(self, task: Any) -> None:
        self.task = task

    async def enqueue(self, payload: dict[str, Any]) -> None:
        await self.task.defer_async(**payload)

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        await self.task.batch_defer_async(*payloads)


@dataclass
class ProcrastinateSystem(System):
    name: ClassVar[str] = "procrastinate"
    count_all_sql: ClassVar[str] = "SELECT count(*) FROM procrastinate_jobs"
    count_done_sql: ClassVar[str] = (
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    )
    count_failed_sql: ClassVar[str | None] = (
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'"
    )
    done_times_sql: ClassVar[str | None] = (
        "SELECT extract(epoch FROM at) FROM procrastinate_events WHERE type = 'succeeded'"
    )

    def check_importable(self) -> None:
        import procrastinate  # noqa: F401

    def describe(self) -> str:
        import importlib.metadata

        version = importlib.metadata.version("procrastinate")
        return (
            f"procrastinate {version}: `procrastinate --app tests.benchmarks.handlers_procrastinate.app "
            f"worker --concurrency {self.settings.procrastinate_concurrency} --queues default` "
            "(PsycopgConnector, async task, listen_notify on, jobs kept); schema via "
            "app.schema_manager.apply_schema_async(); enqueue via defer_async / batch_defer_async"
        )

    async def setup(self) -> None:
        from tests.benchmarks.handlers_procrastinate import app

        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    @asynccontextmanager
    async def producer(self) -> AsyncIterator[Producer]:
        from tests.benchmarks.handlers_procrastinate import app, noop

        async with app.open_async():
            yield _ProcrastinateProducer(noop)

    def worker_command(self, db_url: str, index: int) -> tuple[list[str], dict[str, str]]:
        return (
            [
                sys.executable, "-m", "procrastinate",
                "--app", "tests.benchmarks.handlers_procrastinate.app",
                "worker",
                "--concurrency", str(self.settings.procrastinate_concurrency),
                "--queues", QUEUE,
                "--name", f"bench-{index}",
            ],
            {},
        )


# ---------------------------------------------------------------------------------- skiplock


class _SkiplockProducer:
    """One autocommit psycopg connection. skiplock writes into the caller's transaction; with no
    transaction open, its enqueue (one INSERT statement) is its own transaction, committed on
    return: one round trip per call, as for PgQueuer's and the raw producer's single statement."""

    def __init__(self, skiplock: Any, conn: Any) -> None:
        self.skiplock = skiplock
        self.conn = conn

    async def enqueue(self, payload: dict[str, Any]) -> None:
        self.skiplock.enqueue(self.conn, KIND, payload, queue=QUEUE)

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        self.skiplock.enqueue_many(self.conn, KIND, payloads, queue=QUEUE)


@dataclass
class SkiplockSystem(System):
    name: ClassVar[str] = "skiplock"
    count_all_sql: ClassVar[str] = "SELECT count(*) FROM skiplock.tasks"
    count_done_sql: ClassVar[str] = "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'"
    count_failed_sql: ClassVar[str | None] = (
        "SELECT count(*) FROM skiplock.tasks WHERE state = 'failed'"
    )
    done_times_sql: ClassVar[str | None] = (
        "SELECT extract(epoch FROM finished_at) FROM skiplock.tasks WHERE state = 'completed'"
    )

    def check_importable(self) -> None:
        import skiplock

        for attr in ("migrate", "enqueue", "enqueue_many", "task"):
            if not hasattr(skiplock, attr):
                raise ImportError(f"skiplock does not export {attr!r} yet")

    def describe(self) -> str:
        return (
            "skiplock: `skiplock worker --tasks tests.benchmarks.handlers_skiplock --queues default "
            f"--concurrency {self.settings.skiplock_concurrency}` (sync handler, "
            f"SKIPLOCK_CLAIM_BATCH={self.settings.skiplock_claim_batch} "
            f"({'engine default: claims up to the free slots' if not self.settings.skiplock_claim_batch else 'rows per claim'}), "
            "SKIPLOCK_METRICS_PORT=0, other settings at their defaults); schema via skiplock.migrate(url); enqueue via "
            "skiplock.enqueue / enqueue_many on one autocommit psycopg connection (one statement, "
            "so one transaction, per call)"
        )

    async def setup(self) -> None:
        import skiplock

        skiplock.migrate(_db_url())

    @asynccontextmanager
    async def producer(self) -> AsyncIterator[Producer]:
        import psycopg
        import skiplock

        with psycopg.connect(_db_url(), autocommit=True) as conn:
            yield _SkiplockProducer(skiplock, conn)

    def worker_command(self, db_url: str, index: int) -> tuple[list[str], dict[str, str]]:
        script = shutil.which("skiplock", path=os.path.dirname(sys.executable))
        head = (
            [script]
            if script
            else [sys.executable, "-c", "import sys; from skiplock.cli import main; sys.exit(main())"]
        )
        return (
            head + [
                "worker",
                "--tasks", "tests.benchmarks.handlers_skiplock",
                "--queues", QUEUE,
                "--concurrency", str(self.settings.skiplock_concurrency),
            ],
            {
                "SKIPLOCK_DATABASE_URL": db_url,
                "SKIPLOCK_METRICS_PORT": "0",
                "SKIPLOCK_CLAIM_BATCH": str(self.settings.skiplock_claim_batch),
            },
        )

    def api_command(self, db_url: str, bind: str, workers: int) -> tuple[list[str], dict[str, str]] | None:
        """`skiplock api` (gunicorn, gthread workers with the default 4 threads each); the caller
        adds SKIPLOCK_API_TOKENS."""
        argv, _ = self.worker_command(db_url, 0)
        head = argv[: argv.index("worker")]
        return (
            head + ["api", "--bind", bind, "--workers", str(workers)],
            {"SKIPLOCK_DATABASE_URL": db_url, "SKIPLOCK_LOG_FORMAT": "text", "SKIPLOCK_LOG_LEVEL": "WARNING"},
        )


SYSTEMS: dict[str, type[System]] = {
    cls.name: cls for cls in (SkiplockSystem, PgQueuerSystem, ProcrastinateSystem, RawSystem)
}


def make(name: str, settings: WorkerSettings) -> System:
    return SYSTEMS[name](settings=settings)

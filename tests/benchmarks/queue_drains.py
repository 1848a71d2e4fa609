"""Drains of a seeded queue by real `skiplock worker` processes: the machinery shared by backlog.py
and pooler_drain.py. A server (a throwaway cluster with Postgres's defaults unless one is named),
template databases seeded set-based and vacuumed, a fresh copy per run, workers spawned and stopped
as an operator runs them, and rates read from the database's own timestamps.

A report's machinery: nothing here asserts a timing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from skiplock.engine import migrate
from skiplock.engine.store import Store
from tests.benchmarks.handlers_skiplock import KIND
from tests.benchmarks.run import BENCH_SERVER_SETTINGS, REPO_ROOT, compile_bytecode, server_facts, url_with_db

# One statement: `n` no-op tasks spread over `queues`, due now, as enqueue_many would leave them
# (the insert trigger writes their 'queued' events). ids are UUIDv7 in insertion order, as
# enqueued tasks' are.
SEED = """
INSERT INTO skiplock.tasks (id, kind, queue, payload)
SELECT skiplock.uuid7(), %(kind)s, (%(queues)s::text[])[1 + (i %% cardinality(%(queues)s::text[]))],
       jsonb_build_object('i', i)
FROM generate_series(1, %(n)s) AS i
"""

CLAIMS = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM skiplock.lease_tokens"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


@contextlib.contextmanager
def server(url: str | None) -> Iterator[str]:
    """`url`, or a throwaway cluster's with Postgres's default settings (autovacuum, fsync,
    synchronous commit and full-page writes on), removed at the end."""
    if url:
        yield url
        return
    from tests.pgcluster import ThrowawayCluster

    print("starting a throwaway Postgres with default settings", file=sys.stderr)
    with ThrowawayCluster(settings=BENCH_SERVER_SETTINGS) as cluster:
        yield cluster.url


class Databases:
    """Template databases (migrated, seeded, vacuumed) and fresh copies of them, all dropped at
    the end."""

    def __init__(self, server_url: str):
        self.server_url = server_url
        self.made: list[str] = []
        self.templates: dict[tuple[int, tuple[str, ...]], str] = {}
        self.created = 0

    def _admin(self, statement: sql.Composable) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(statement)

    def template(self, n: int, queues: Sequence[str]) -> str:
        """The name of a database holding `n` queued tasks over `queues`, vacuumed and analyzed
        (as autovacuum leaves a table after a bulk load); made once per size."""
        key = (n, tuple(queues))
        if key not in self.templates:
            name = self.create()
            url = url_with_db(self.server_url, name)
            started = time.monotonic()
            migrate.apply(url)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(SEED, {"kind": KIND, "queues": list(queues), "n": n})
                conn.execute("VACUUM (ANALYZE) skiplock.tasks")
                conn.execute("VACUUM (ANALYZE) skiplock.task_events")
            print(f"seeded {n:,} tasks over {len(queues)} queue(s) in {time.monotonic() - started:.0f} s",
                  file=sys.stderr)
            self.templates[key] = name
        return self.templates[key]

    def create(self) -> str:
        """A new empty database (dropped at the end): its name."""
        self.created += 1
        name = f"bench_tpl_{os.getpid()}_{self.created}"
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.made.append(name)
        return name

    def url(self, name: str) -> str:
        return url_with_db(self.server_url, name)

    def copy(self, template: str) -> tuple[str, str]:
        """A fresh copy of `template`: (name, url). FILE_COPY copies the files after a checkpoint:
        the copy starts with no dirty pages of the seeding, and no WAL is written for it."""
        name = f"{template}_run{len(self.made)}"
        for attempt in range(100):
            try:
                self._admin(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template)))
                break
            except psycopg.errors.ObjectInUse:  # a session of the template still closing
                time.sleep(0.2)
        self.made.append(name)
        url = url_with_db(self.server_url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        return name, url

    def drop(self, name: str) -> None:
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if name in self.made:
            self.made.remove(name)

    def drop_all(self) -> None:
        for name in reversed(list(self.made)):
            try:
                self.drop(name)
            except psycopg.Error as exc:
                print(f"warning: could not drop {name}: {exc}", file=sys.stderr)


class Workers:
    """Real `skiplock worker` processes, each in its own process group, logs in one directory."""

    def __init__(self) -> None:
        self.logs = Path(tempfile.mkdtemp(prefix="skiplock-bench-drains-"))
        self.procs: list[subprocess.Popen] = []

    def spawn(self, url: str, queues: Sequence[str], concurrency: int, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        full = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
        full.update({"SKIPLOCK_DATABASE_URL": url, "SKIPLOCK_METRICS_PORT": "0", "SKIPLOCK_LOG_LEVEL": "WARNING",
                     "PYTHONPATH": os.pathsep.join((str(REPO_ROOT / "services"), str(REPO_ROOT))),  # this checkout's code
                     "PYTHONUNBUFFERED": "1", **(env or {})})
        return self.start([sys.executable, "-m", "skiplock.cli", "worker", "--tasks",
                           "tests.benchmarks.handlers_skiplock", "--queues", ",".join(queues),
                           "--concurrency", str(concurrency)], full)

    def start(self, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
        """Any worker process (another system's too), stopped and checked like skiplock's."""
        log = self.logs / f"worker-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(list(argv), cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                tail = proc.log.read_text(errors="replace")[-2000:]  # type: ignore[attr-defined]
                raise RuntimeError(f"a worker exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM (the worker gives back what it holds and exits), SIGKILL after 15 s."""
        procs, self.procs = self.procs, []
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextlib.contextmanager
def held_back(url: str, queue: str, workers: Workers, count: int) -> Iterator[None]:
    """The queue paused while the block spawns `count` workers; once every one has registered
    (its listener, claimer and keeper are running), the pause is lifted, which wakes them all
    (pause_clear notifies). So a drain by several processes is timed without their start-up,
    which on a small machine would overlap the first processes' work."""
    store = Store.pooled(url, min_size=1, max_size=1).open(wait=True)
    try:
        store.tasks.pause_set("queue", queue)
        yield
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while conn.execute("SELECT count(*) FROM skiplock.workers").fetchone()[0] < count:
                workers.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fewer than {count} workers registered after 120 s")
                time.sleep(0.1)
        time.sleep(0.5)  # the last one's listener, connecting as it registers
        store.tasks.pause_clear("queue", queue)
    finally:
        store.close()


def wait_claims(conn: psycopg.Connection, workers: Workers, target: int, timeout: float) -> None:
    """Until `target` claims were made (the lease-token sequence counts them: a cheap read)."""
    deadline = time.monotonic() + timeout
    while conn.execute(CLAIMS).fetchone()[0] < target:
        workers.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {target} claims after {timeout:.0f} s")
        time.sleep(0.1)


def wait_completed(conn: psycopg.Connection, workers: Workers, target: int, timeout: float,
                   kind: str | None = None) -> None:
    """Until `target` tasks (of `kind`, if given) are completed: first the claims (a cheap read),
    then the count."""
    deadline = time.monotonic() + timeout
    wait_claims(conn, workers, target, timeout)
    while conn.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'completed' "
                       "AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)", {"kind": kind}).fetchone()[0] < target:
        workers.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {target} tasks completed after {timeout:.0f} s")
        time.sleep(0.05)


class SnapshotWatch(threading.Thread):
    """The longest-held snapshot in a database while a run lasts: Postgres keeps every row version
    that snapshot may see, and a claim walks past the dead ones (read every 0.25 s)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.longest = (0.0, "")  # (seconds, who)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(0.25):
                row = conn.execute(
                    "SELECT extract(epoch FROM now() - coalesce(xact_start, query_start))::float8, "
                    "       coalesce(nullif(application_name, ''), backend_type) || ': ' || left(query, 60) "
                    "FROM pg_stat_activity WHERE datname = current_database() AND backend_xmin IS NOT NULL "
                    "  AND pid <> pg_backend_pid() ORDER BY 1 DESC NULLS LAST LIMIT 1").fetchone()
                if row and row[0] and row[0] > self.longest[0]:
                    self.longest = (row[0], row[1])

    def __enter__(self) -> "SnapshotWatch":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join(5)


def autovacuums(conn: psycopg.Connection) -> str:
    """The autovacuum and autoanalyze runs on the tasks and their events since the database was
    made (a fresh copy counts from zero)."""
    rows = conn.execute("SELECT relname, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
                        "WHERE schemaname = 'skiplock' AND relname IN ('tasks', 'task_events') ORDER BY relname")
    return ", ".join(f"{name} {vacuums}/{analyzes}" for name, vacuums, analyzes in rows)


@dataclass
class Rate:
    """Tasks per second between two events of a drain, from the database's own timestamps."""

    tasks: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.tasks / self.seconds if self.seconds > 0 else float("nan")


def times(conn: psycopg.Connection, column: str) -> list[float]:
    """Every task's `column` (started_at: its first claim; finished_at: its outcome) as epoch
    seconds, in order."""
    return [r[0] for r in conn.execute(
        sql.SQL("SELECT extract(epoch FROM {c})::float8 FROM skiplock.tasks WHERE {c} IS NOT NULL ORDER BY 1")
        .format(c=sql.Identifier(column)))]


def steady(stamps: Sequence[float], skip: int, end: int | None = None) -> Rate:
    """The rate from the `skip`-th to the `end`-th event (the first ones, and the batch that shares
    the skip-th timestamp, are start-up: connecting, warming caches, the first claims)."""
    end = len(stamps) - 1 if end is None else min(end, len(stamps) - 1)
    first = stamps[skip]
    after = sum(1 for t in stamps[skip:end + 1] if t > first)
    return Rate(after, stamps[end] - first)


def slices(stamps: Sequence[float], skip: int, end: int, parts: int) -> list[float]:
    """The rate in each of `parts` equal runs of events between `skip` and `end`."""
    size = (end - skip) // parts
    return [steady(stamps, skip + i * size, skip + (i + 1) * size).per_second for i in range(parts)]


def header(server_url: str) -> str:
    return (f"{server_facts(server_url)}; {os.cpu_count()} CPUs; load average before: {load_average()}; "
            "skiplock's modules compiled to bytecode first")


def prepare() -> None:
    compile_bytecode()

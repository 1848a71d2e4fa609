"""Durable workflows side by side: skiplock's `ctx.step` and `ctx.step_transaction` against DBOS
Transact's queue, each drained by one worker process, in one run (issue 33).

    python -m tests.benchmarks.durable [--tasks 5000] [--repeat 3] [--server URL]
                                       [--dbos-worker-concurrency 100] [--dbos-polling-interval 0.1]

One worker process drains N queued workflows, each way in a fresh copy of a database seeded once
(and vacuumed), the ways in turn, --repeat rounds:

| way | one task (workflow) |
|---|---|
| skiplock, no steps | `bench.noop`: the plain drain, for what the steps add to it |
| skiplock, 3 steps | `bench.steps`: three `ctx.step(name, fn, i)` of a no-op function |
| skiplock, 1 step_transaction | `bench.step_transaction`: one `ctx.step_transaction(name, fn)` whose fn runs one tiny INSERT (one row into an unindexed table) |
| DBOS, 3 steps | `@DBOS.workflow` calling three `@DBOS.step` no-op functions, enqueued with `Queue.enqueue` (tests/benchmarks/dbos_app.py) |

skiplock's worker is `skiplock worker --concurrency 100`, as the other reports run it; DBOS's is
one process with the queue's `worker_concurrency` (100) and `polling_interval_sec` (0.1 s). Each
system's database is its own, on the same server.

The figures: workflows per second from the first completion to the last (each system's own
completion timestamps), and with the worker's start-up; steps per second (workflows/s times the
steps of one); the server's CPU per step and per workflow (user + system time of every Postgres
process, the postmaster with the children it reaped included, read from /proc before the
worker starts and when the last workflow is done: background writers and autovacuum count, and
so does the worker's connecting); the worker process's CPU per workflow. The server is a
throwaway cluster with Postgres's default settings (autovacuum on) unless --server (or
SKIPLOCK_TEST_DATABASE_URL) names one; the CPU columns need a server on this machine. A report:
nothing here asserts a timing. Results go to tests/benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import psycopg

from tests.benchmarks.api_probes import worker_pids as children
from tests.benchmarks.handlers_skiplock import KIND, STEP_TRANSACTION, STEPS
from tests.benchmarks.queue_drains import (SEED, Databases, Workers, header, load_average, prepare, server, steady,
                                           wait_completed)
from tests.benchmarks.run import REPO_ROOT, proc_cpu_seconds

CONCURRENCY = 100


@dataclass(frozen=True)
class Way:
    label: str
    system: str  # "skiplock" or "dbos"
    kind: str  # skiplock's task kind; "" for DBOS
    steps: int  # recorded steps per workflow


WAYS = (
    Way("skiplock, no steps", "skiplock", KIND, 0),
    Way("skiplock, 3 steps", "skiplock", STEPS, 3),
    Way("skiplock, 1 step_transaction", "skiplock", STEP_TRANSACTION, 1),
    Way("DBOS, 3 steps", "dbos", "", 3),
)

DBOS_DONE = "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
DBOS_FAILED = "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ERROR', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')"
DBOS_STAMPS = "SELECT updated_at / 1000.0 FROM dbos.workflow_status WHERE status = 'SUCCESS' ORDER BY 1"
SKIPLOCK_STAMPS = ("SELECT extract(epoch FROM finished_at)::float8 FROM skiplock.tasks "
                   "WHERE state = 'completed' ORDER BY 1")


def server_cpu_seconds(conn: psycopg.Connection) -> float | None:
    """User + system CPU that the whole server has used: the postmaster with every child it
    reaped (backends that ended), and its live children (backends, autovacuum, checkpointer, WAL
    writer). None when the server is not a process on this machine."""
    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        with open(f"/proc/{backend}/stat") as f:
            postmaster = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{postmaster}/cmdline", "rb") as f:
            if b"postgres" not in f.read():
                return None
        kids = children(postmaster)
    except (OSError, ValueError, IndexError):
        return None
    own = proc_cpu_seconds(postmaster)
    if own is None:
        return None
    # a child that ended between the two reads is missed: its time moves to the postmaster's
    return own + sum(proc_cpu_seconds(pid) or 0.0 for pid in kids)


def skiplock_template(dbs: Databases, n: int, way: Way) -> str:
    """Migrated, n tasks of the way's kind queued, the step_transaction's table, vacuumed."""
    key = (n, (way.kind,))
    if key not in dbs.templates:
        name = dbs.template(0, [way.label])  # migrated and empty; the queue list only names it apart
        with psycopg.connect(dbs.url(name), autocommit=True) as conn:
            conn.execute("CREATE TABLE public.bench_step_rows (task_id uuid NOT NULL)")
            conn.execute(SEED, {"kind": way.kind, "queues": ["default"], "n": n})
            conn.execute("VACUUM (ANALYZE) skiplock.tasks")
            conn.execute("VACUUM (ANALYZE) skiplock.task_events")
        dbs.templates[key] = name
    return dbs.templates[key]


def dbos_template(dbs: Databases, n: int, args: argparse.Namespace) -> str:
    """DBOS's system database, migrated by DBOS, the queue registered, n workflows enqueued."""
    key = (n, ("dbos",))
    if key not in dbs.templates:
        name = dbs.create()
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "tests.benchmarks.dbos_app", "setup", dbs.url(name), "--tasks", str(n),
                        "--worker-concurrency", str(args.dbos_worker_concurrency),
                        "--polling-interval", str(args.dbos_polling_interval)],
                       cwd=REPO_ROOT, env=dbos_env(), check=True, timeout=600 + n / 10)
        with psycopg.connect(dbs.url(name), autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
        print(f"DBOS: {n:,} workflows enqueued in {time.monotonic() - started:.0f} s", file=sys.stderr)
        dbs.templates[key] = name
    return dbs.templates[key]


def dbos_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "DBOS_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_dbos(conn: psycopg.Connection, workers: Workers, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while conn.execute(DBOS_DONE).fetchone()[0] < n:
        workers.check_alive()
        failed = conn.execute(DBOS_FAILED).fetchone()[0]
        if failed:
            raise RuntimeError(f"{failed} DBOS workflows failed")
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} DBOS workflows done after {timeout:.0f} s")
        time.sleep(0.1)


def drain(dbs: Databases, n: int, way: Way, args: argparse.Namespace) -> dict:
    template = dbos_template(dbs, n, args) if way.system == "dbos" else skiplock_template(dbs, n, way)
    name, url = dbs.copy(template)
    workers = Workers()
    timeout = 300 + n / 5
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            cpu_before = server_cpu_seconds(conn)
            spawned = time.time()
            if way.system == "dbos":
                proc = workers.start([sys.executable, "-m", "tests.benchmarks.dbos_app", "worker", url], dbos_env())
            else:
                proc = workers.spawn(url, ["default"], CONCURRENCY)
            try:
                if way.system == "dbos":
                    wait_dbos(conn, workers, n, timeout)
                else:
                    wait_completed(conn, workers, n, timeout)
                # read before the worker stops: its connections' backends end with it
                cpu_after = server_cpu_seconds(conn)
                worker_cpu = proc_cpu_seconds(proc.pid)
            finally:
                workers.stop()
            stamps = [float(r[0]) for r in conn.execute(DBOS_STAMPS if way.system == "dbos" else SKIPLOCK_STAMPS)]
            if way.kind == STEP_TRANSACTION:
                rows = conn.execute("SELECT count(*), count(DISTINCT task_id) FROM public.bench_step_rows").fetchone()
                if rows != (n, n):
                    raise RuntimeError(f"step_transaction rows: {rows[0]} for {rows[1]} tasks, {n} expected")
        server_cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        return {"rate": steady(stamps, 0).per_second, "with_startup": n / (stamps[-1] - spawned),
                "server_cpu": server_cpu, "worker_cpu": worker_cpu}
    finally:
        dbs.drop(name)


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def micros(seconds: float | None, count: int) -> str:
    return "–" if seconds is None or not count else f"{seconds / count * 1e6:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.durable", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="workflows per drain (default 5000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every way (default 3); medians shown")
    parser.add_argument("--dbos-worker-concurrency", type=int, default=100,
                        help="the DBOS queue's worker_concurrency (default 100, skiplock's --concurrency)")
    parser.add_argument("--dbos-polling-interval", type=float, default=0.1,
                        help="the DBOS queue's polling_interval_sec (default 0.1; DBOS's own default is 1.0)")
    parser.add_argument("--server", metavar="URL", default=os.environ.get("SKIPLOCK_TEST_DATABASE_URL"),
                        help="a server of yours (default: $SKIPLOCK_TEST_DATABASE_URL, else a throwaway cluster)")
    args = parser.parse_args(argv)
    prepare()
    started = time.monotonic()
    n = args.tasks
    runs: dict[str, list[dict]] = {way.label: [] for way in WAYS}
    with server(args.server) as url:
        print(f"## Durable workflows: skiplock's steps and DBOS Transact's, side by side\n\n{header(url)}")
        dbs = Databases(url)
        try:
            for rep in range(args.repeat):
                for way in WAYS:
                    print(f"{way.label}, run {rep + 1}/{args.repeat}", file=sys.stderr)
                    runs[way.label].append(drain(dbs, n, way, args))
        finally:
            dbs.drop_all()
    print(f"\n### {n:,} workflows, one worker process each, median of {args.repeat}\n")
    dbos = importlib.metadata.version("dbos")
    print(f"skiplock: `skiplock worker --concurrency {CONCURRENCY}`; DBOS {dbos}: one process, queue "
          f"worker_concurrency={args.dbos_worker_concurrency}, polling_interval_sec={args.dbos_polling_interval:g}, "
          "other settings at their defaults.\n")
    print("| way | workflows/s, first to last completion | each run | incl. start-up | steps/s | "
          "Postgres CPU per step (µs) | Postgres CPU per workflow (µs) | worker CPU per workflow (µs) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    rates: dict[str, float] = {}
    for way in WAYS:
        results = runs[way.label]
        rate = rates[way.label] = statistics.median(r["rate"] for r in results)
        each = ", ".join(f"{r['rate']:,.0f}" for r in results)
        server_cpu = median([r["server_cpu"] for r in results])
        steps = f"{rate * way.steps:,.0f}" if way.steps else "–"
        print(f"| {way.label} | {rate:,.0f} | {each} | {statistics.median(r['with_startup'] for r in results):,.0f} | "
              f"{steps} | {micros(server_cpu, n * way.steps)} | {micros(server_cpu, n)} | "
              f"{micros(median([r['worker_cpu'] for r in results]), n)} |")
    dbos_rate = rates["DBOS, 3 steps"]
    print(f"\nskiplock's 3-step workflows per second ÷ DBOS's: "
          f"{rates['skiplock, 3 steps'] / dbos_rate:.1f}×; "
          f"the 1-step_transaction workflows ÷ DBOS's: {rates['skiplock, 1 step_transaction'] / dbos_rate:.1f}×. "
          f"3 steps against no steps in skiplock: {rates['skiplock, 3 steps'] / rates['skiplock, no steps']:.2f}.")
    print(f"\nTook {time.monotonic() - started:.0f} s; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

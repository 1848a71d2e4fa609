"""A drain by one worker directly and through PgBouncer, in one run (issue 19).

    python -m tests.benchmarks.pooler_drain [--tasks 50000] [--repeat 3] [--server URL]

N no-op tasks on one queue, drained by one real worker process (`skiplock worker --concurrency
100`), each run in a fresh copy of a database seeded set-based and vacuumed, four ways in turn:

| way | the worker's connections |
|---|---|
| direct | straight to Postgres |
| session | through a PgBouncer in session mode (`SKIPLOCK_DATABASE_POOLER=session`) |
| transaction, LISTEN direct | PgBouncer in transaction mode (`SKIPLOCK_DATABASE_POOLER=transaction`), LISTEN on `SKIPLOCK_LISTEN_DATABASE_URL` (direct) |
| transaction, polling | the same with `SKIPLOCK_LISTEN=false` |

PgBouncer is Debian's, one of the run's own per run (tests/support/pgbouncer.py), in front of that
run's database only. The rate is from the first completion to the last (finished_at), and from
spawning the worker to the last completion. The server is a throwaway cluster with Postgres's
default settings unless --server names one. A report: nothing here asserts a timing. Results go
to tests/benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from tests.benchmarks.queue_drains import (Databases, Workers, header, load_average, prepare, server, steady, times,
                                           wait_completed)
from tests.support.pgbouncer import PgBouncer

CONCURRENCY = 100
WAYS = {  # way: (PgBouncer's pool mode or None, the worker's environment; DIRECT stands for the direct URL)
    "direct": (None, {}),
    "session": ("session", {"SKIPLOCK_DATABASE_POOLER": "session"}),
    "transaction, LISTEN direct": ("transaction", {"SKIPLOCK_DATABASE_POOLER": "transaction",
                                                   "SKIPLOCK_LISTEN_DATABASE_URL": "DIRECT"}),
    "transaction, polling": ("transaction", {"SKIPLOCK_DATABASE_POOLER": "transaction", "SKIPLOCK_LISTEN": "false"}),
}


def drain(dbs: Databases, n: int, way: str, scratch: Path) -> dict:
    mode, env = WAYS[way]
    name, direct = dbs.copy(dbs.template(n, ["default"]))
    bouncer = PgBouncer(direct, scratch / f"{name}-pgbouncer", mode).start() if mode else None
    workers = Workers()
    try:
        url = bouncer.url if bouncer else direct
        with psycopg.connect(direct, autocommit=True) as conn:
            spawned = time.time()
            workers.spawn(url, ["default"], CONCURRENCY, {k: direct if v == "DIRECT" else v for k, v in env.items()})
            try:
                wait_completed(conn, workers, n, timeout=120 + n / 200)
            finally:
                workers.stop()
            stamps = times(conn, "finished_at")
        return {"steady": steady(stamps, 0).per_second, "with_startup": n / (stamps[-1] - spawned)}
    finally:
        if bouncer:
            bouncer.stop()
        dbs.drop(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.pooler_drain",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", metavar="URL", help="a server of yours (default: a throwaway cluster)")
    args = parser.parse_args(argv)
    prepare()
    started = time.monotonic()
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    with server(args.server) as url, tempfile.TemporaryDirectory(prefix="skiplock-pooler-") as scratch:
        print(f"## A drain directly and through PgBouncer\n\n{header(url)}")
        dbs = Databases(url)
        try:
            for rep in range(args.repeat):
                for way in WAYS:
                    print(f"{way}, run {rep + 1}/{args.repeat}", file=sys.stderr)
                    runs[way].append(drain(dbs, args.tasks, way, Path(scratch)))
        finally:
            dbs.drop_all()
    base = statistics.median(r["steady"] for r in runs["direct"])
    print(f"\n### {args.tasks:,} no-op tasks, one worker (concurrency {CONCURRENCY}), median of {args.repeat}\n")
    print("| way | tasks/s, first to last completion | each run | incl. start-up | vs direct |")
    print("|---|---:|---|---:|---:|")
    for way, results in runs.items():
        rate = statistics.median(r["steady"] for r in results)
        each = ", ".join(f"{r['steady']:,.0f}" for r in results)
        print(f"| {way} | {rate:,.0f} | {each} | {statistics.median(r['with_startup'] for r in results):,.0f} | "
              f"{rate / base:.2f} |")
    print(f"\nTook {time.monotonic() - started:.0f} s; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Workflows' cost: what a fan-in adds to each of its parents (issue 21), in one run.

    python -m tests.benchmarks.workflows [--tasks 10000] [--repeat 3] [--server URL]

One worker process (`skiplock worker --concurrency 100`) drains N no-op tasks, in a fresh copy of
a database seeded set-based and vacuumed, two ways in turn:

| way | the database |
|---|---|
| plain | N tasks |
| fan-in | the same N tasks, all parents of one more task (enqueued with `depends_on`), which runs once the last is final |

Each parent's completion then also moves the dependent's counters, under its row lock, in the
outcome's transaction. The figures: the rate of the N tasks from the first completion to the last
(finished_at), the extra time per parent that it gives ((1/rate_fan-in - 1/rate_plain), in µs),
and, for the fan-in, the time from the last parent's completion to the dependent's. Also the
time to enqueue the dependent (locking and counting N parents). The server is a throwaway cluster
with Postgres's default settings unless --server (or SKIPLOCK_TEST_DATABASE_URL) names one. A
report: nothing here asserts a timing. Results go to tests/benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import psycopg

import skiplock
from tests.benchmarks.handlers_skiplock import KIND
from tests.benchmarks.queue_drains import (Databases, Workers, header, load_average, prepare, server, steady,
                                           wait_completed)

CONCURRENCY = 100
WAYS = ("plain", "fan-in")


def seeded(dbs: Databases, n: int, way: str, enqueue_seconds: dict[str, float]) -> str:
    """A template for `way`, made once; the fan-in's records how long enqueueing its dependent
    (locking and counting the N parents) took."""
    key = (n, (way,))
    if key not in dbs.templates:
        name = dbs.template(n, [way])
        if way == "fan-in":
            with psycopg.connect(dbs.url(name), autocommit=True) as conn:
                parents = [r[0] for r in conn.execute("SELECT id FROM skiplock.tasks ORDER BY id")]
                started = time.perf_counter()
                skiplock.enqueue(conn, KIND, {"fan_in": True}, depends_on=parents, queue=way)
                enqueue_seconds[way] = time.perf_counter() - started
                conn.execute("VACUUM (ANALYZE) skiplock.tasks")
        dbs.templates[key] = name
    return dbs.templates[key]


def drain(dbs: Databases, n: int, way: str, enqueue_seconds: dict[str, float]) -> dict:
    name, url = dbs.copy(seeded(dbs, n, way, enqueue_seconds))
    total = n + (way == "fan-in")
    workers = Workers()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            workers.spawn(url, [way], CONCURRENCY)
            try:
                wait_completed(conn, workers, total, timeout=120 + n / 200)
            finally:
                workers.stop()
            stamps = [r[0] for r in conn.execute(
                "SELECT extract(epoch FROM finished_at)::float8 FROM skiplock.tasks "
                "WHERE NOT (payload ? 'fan_in') ORDER BY 1")]
            last_step = None
            if way == "fan-in":
                dependent_end = conn.execute("SELECT extract(epoch FROM finished_at)::float8 FROM skiplock.tasks "
                                             "WHERE payload ? 'fan_in'").fetchone()[0]
                last_step = dependent_end - stamps[-1]
        return {"rate": steady(stamps, 0).per_second, "last_step": last_step}
    finally:
        dbs.drop(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.workflows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)  # depends_on takes at most 10,000 parents
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", metavar="URL", default=os.environ.get("SKIPLOCK_TEST_DATABASE_URL"),
                        help="a server of yours (default: $SKIPLOCK_TEST_DATABASE_URL, else a throwaway cluster)")
    args = parser.parse_args(argv)
    prepare()
    started = time.monotonic()
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    enqueue_seconds: dict[str, float] = {}
    with server(args.server) as url:
        print(f"## Workflows: what a fan-in costs its parents\n\n{header(url)}")
        dbs = Databases(url)
        try:
            for rep in range(args.repeat):
                for way in WAYS:
                    print(f"{way}, run {rep + 1}/{args.repeat}", file=sys.stderr)
                    runs[way].append(drain(dbs, args.tasks, way, enqueue_seconds))
        finally:
            dbs.drop_all()
    plain = statistics.median(r["rate"] for r in runs["plain"])
    fan_in = statistics.median(r["rate"] for r in runs["fan-in"])
    print(f"\n### {args.tasks:,} no-op tasks, one worker (concurrency {CONCURRENCY}), median of {args.repeat}\n")
    print("| way | tasks/s, first to last completion | each run | vs plain |")
    print("|---|---:|---|---:|")
    for way, results in runs.items():
        rate = statistics.median(r["rate"] for r in results)
        each = ", ".join(f"{r['rate']:,.0f}" for r in results)
        print(f"| {way} | {rate:,.0f} | {each} | {rate / plain:.2f} |")
    extra = (1 / fan_in - 1 / plain) * 1e6
    last = statistics.median(r["last_step"] for r in runs["fan-in"]) * 1000
    enqueue = enqueue_seconds["fan-in"]
    print(f"\nExtra time per parent: {extra:.1f} µs. The dependent completed {last:.0f} ms after its last "
          f"parent (median). Enqueueing it with {args.tasks:,} parents took {enqueue:.2f} s.")
    print(f"\nTook {time.monotonic() - started:.0f} s; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Flow control's cost: a drain by one worker with no limits, with 50 limited kinds present, and
of tasks spread over 1,000 concurrency keys limited to one run each, in one run (issue 20).

    python -m tests.benchmarks.flow_control [--tasks 50000] [--repeat 3] [--server URL]

Each run drains N no-op tasks of one queue with one real worker process (`skiplock worker
--concurrency 100`), in a fresh copy of a database seeded set-based and vacuumed, three ways in
turn:

| way | the database |
|---|---|
| no limits | N tasks of `bench.noop`; no limit exists |
| 50 limited kinds present | the same N tasks, and 50 kinds each limited to 1 run at once and 1 start a minute, with 20 queued tasks each in the same queue: parked at the first claims, then held back for the whole drain (the worker claims limited work on every round) |
| 1,000 keys, limit 1 | N tasks of `bench.keyed` over 1,000 concurrency keys, the kind limited to 1 run per key |

The rate is the measured kind's tasks from the first completion to the last (finished_at). The
server is a throwaway cluster with Postgres's default settings unless --server (or
SKIPLOCK_TEST_DATABASE_URL) names one. A
report: nothing here asserts a timing. Results go to tests/benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import psycopg

from skiplock.engine.limits import Limit, apply_limits
from skiplock.engine.store import Store
from tests.benchmarks.handlers_skiplock import KEYED, KIND, LIMITED
from tests.benchmarks.queue_drains import (Databases, Workers, header, load_average, prepare, server, steady,
                                           wait_completed)

CONCURRENCY = 100
KEYS = 1000
HELD_BACK_PER_KIND = 20

# n tasks of `kind` over `keys` concurrency keys ('' when 0), due now, in id order
SEED = """
INSERT INTO skiplock.tasks (id, kind, queue, payload, concurrency_key)
SELECT skiplock.uuid7(), %(kind)s, 'default', jsonb_build_object('i', i),
       CASE WHEN %(keys)s > 0 THEN 'key:' || (i %% %(keys)s) ELSE '' END
FROM generate_series(1, %(n)s) AS i
"""


def seeded(dbs: Databases, n: int, way: str) -> str:
    """A template database for `way` (made once): migrated, seeded, limits set, vacuumed."""
    key = (n, (way,))
    if key in dbs.templates:
        return dbs.templates[key]
    name = dbs.template(0, [way])  # migrated and empty, made and dropped by Databases
    url = dbs.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        if way == "1,000 keys, limit 1":
            conn.execute(SEED, {"kind": KEYED, "keys": KEYS, "n": n})
        else:
            conn.execute(SEED, {"kind": KIND, "keys": 0, "n": n})
        if way == "50 limited kinds present":
            for kind in LIMITED:
                conn.execute(SEED, {"kind": kind, "keys": 0, "n": HELD_BACK_PER_KIND})
        conn.execute("VACUUM (ANALYZE) skiplock.tasks")
        conn.execute("VACUUM (ANALYZE) skiplock.task_events")
    store = Store.pooled(url, min_size=1, max_size=1).open(wait=True)
    try:
        if way == "50 limited kinds present":
            apply_limits(store, [Limit.build(kind, concurrency=1, rate="1/m") for kind in LIMITED])
        elif way == "1,000 keys, limit 1":
            apply_limits(store, [Limit.build(KEYED, concurrency=1)])
    finally:
        store.close()
    dbs.templates[key] = name
    return name


WAYS = ("no limits", "50 limited kinds present", "1,000 keys, limit 1")


def drain(dbs: Databases, n: int, way: str) -> dict:
    name, url = dbs.copy(seeded(dbs, n, way))
    kind = KEYED if way == "1,000 keys, limit 1" else KIND
    workers = Workers()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            spawned = time.time()
            workers.spawn(url, ["default"], CONCURRENCY)
            try:
                wait_completed(conn, workers, n, timeout=120 + n / 200, kind=kind)
            finally:
                workers.stop()
            stamps = [r[0] for r in conn.execute(
                "SELECT extract(epoch FROM finished_at)::float8 FROM skiplock.tasks "
                "WHERE kind = %s AND finished_at IS NOT NULL ORDER BY 1", (kind,))]
            held = conn.execute("SELECT count(*) FROM skiplock.tasks WHERE kind <> %s AND state = 'queued'",
                                (kind,)).fetchone()[0]
        return {"steady": steady(stamps, 0).per_second, "with_startup": n / (stamps[-1] - spawned), "held": held}
    finally:
        dbs.drop(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.flow_control",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", metavar="URL", default=os.environ.get("SKIPLOCK_TEST_DATABASE_URL"),
                        help="a server of yours (default: $SKIPLOCK_TEST_DATABASE_URL, else a throwaway cluster)")
    args = parser.parse_args(argv)
    prepare()
    started = time.monotonic()
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    with server(args.server) as url:
        print(f"## Flow control: what limits cost a drain\n\n{header(url)}")
        dbs = Databases(url)
        try:
            for rep in range(args.repeat):
                for way in WAYS:
                    print(f"{way}, run {rep + 1}/{args.repeat}", file=sys.stderr)
                    runs[way].append(drain(dbs, args.tasks, way))
        finally:
            dbs.drop_all()
    base = statistics.median(r["steady"] for r in runs["no limits"])
    print(f"\n### {args.tasks:,} no-op tasks, one worker (concurrency {CONCURRENCY}), median of {args.repeat}\n")
    print("| way | tasks/s, first to last completion | each run | incl. start-up | vs no limits | "
          "limited tasks still held back at the end |")
    print("|---|---:|---|---:|---:|---:|")
    for way, results in runs.items():
        rate = statistics.median(r["steady"] for r in results)
        each = ", ".join(f"{r['steady']:,.0f}" for r in results)
        print(f"| {way} | {rate:,.0f} | {each} | {statistics.median(r['with_startup'] for r in results):,.0f} | "
              f"{rate / base:.2f} | {statistics.median(r['held'] for r in results):,.0f} |")
    print(f"\nTook {time.monotonic() - started:.0f} s; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

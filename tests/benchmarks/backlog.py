"""Claim throughput against the backlog, and drains by 1, 2, 4 and 8 worker processes (issue 19).

    python -m tests.benchmarks.backlog [--backlog 1000000] [--baseline 20000] [--window 200000]
                                       [--queues 8] [--repeat 3] [--workers 1,2,4,8]
                                       [--drain-tasks 100000] [--claim-lanes 0,2]
                                       [--only backlog|workers] [--explain] [--server URL]

**Backlog.** One real worker process (`skiplock worker --queues q0,...,q7 --concurrency 100`)
claims from 8 queues holding --baseline (20,000) tasks in all, and from 8 queues holding --backlog
(1,000,000), in turn, each in a fresh copy of a database seeded set-based and vacuumed (as
autovacuum leaves a table after a bulk load). The claim rate is read from the tasks' own claim
times (started_at): claims after the first fiftieth of the claims measured (start-up), up to the
last, divided by the time between them. Three runs in turn: the baseline, drained whole; the same
number of claims with the backlog queued, so that only the backlog differs (the issue's figure:
at least 0.8 of the baseline); and a --window (200,000) of claims at the backlog, long enough for
the claimed rows' dead index entries to pile up before autovacuum removes them. The rate of each
tenth of a run shows a decay; each run reports the autovacuums during it and the longest-held
snapshot. --explain adds the claim's EXPLAIN (ANALYZE, BUFFERS) as the worker's claims connection
runs it, fresh and after the runs of the last repetition, with the tables' dead rows and the
indexes' sizes.

**Many workers.** --drain-tasks (100,000) tasks on one queue, drained by 1, 2, 4 and 8 worker
processes (concurrency 100 each), each count in a fresh copy. The queue is paused while the
processes start and resumed once all have registered (on 2 cores, 8 processes' start-up would
otherwise overlap the first ones' work): the rate from the first completion to the last
(finished_at), and from the release to the last completion. Meanwhile pg_stat_activity is
sampled every 20 ms for skiplock backends waiting on a lock. Each drain also reports the work it
cost the server, which the machine's load does not move as it moves a rate: the buffers its
database's backends read or found in cache (pg_stat_database), and the WAL written, per task;
and the share of its outcomes written again because another transaction held their row
(skiplock_outcome_writes_busy_total, scraped from the workers).
Each --claim-lanes value
(SKIPLOCK_CLAIM_LANES of the workers; 0: no bound) is a table of its own, its runs alternating with
the others'.

The server is a throwaway cluster with Postgres's default settings (autovacuum, fsync, synchronous
commit and full-page writes on; tests/pgcluster.py) unless --server names one. Runs of each kind
alternate (--repeat times), medians shown. A report: nothing here asserts a timing. Results go to
tests/benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import psycopg

from skiplock.engine.store import Store
from tests.benchmarks.queue_drains import (Databases, SnapshotWatch, Workers, autovacuums, header, held_back,
                                           load_average, prepare, server, slices, steady, times, wait_claims,
                                           wait_completed)
from tests.support.harness import free_port, scrape
from tests.support.lock_watch import LockSampler, is_extension
from tests.support.plans import explain_prepared

CONCURRENCY = 100


def claim_rate(dbs: Databases, n: int, queues: list[str], window: int, *, explain: str | None = None) -> dict:
    """One worker claims `window` tasks of `n` queued over `queues`; the rate of its claims."""
    name, url = dbs.copy(dbs.template(n, queues))
    workers = Workers()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if explain:
                print(explain_claim(url, queues, f"{explain}, fresh"))
            with SnapshotWatch(url) as snapshots:
                workers.spawn(url, queues, CONCURRENCY)
                try:
                    wait_claims(conn, workers, window, timeout=120 + window / 500)
                finally:
                    workers.stop()
            stamps = times(conn, "started_at")
            skip = max(200, window // 50)
            rate = steady(stamps, skip, window)
            result = {"rate": rate.per_second, "slices": slices(stamps, skip, window, 10),
                      "autovacuums": autovacuums(conn), "snapshot": snapshots.longest, "load": load_average()}
            if explain:
                print(explain_claim(url, queues, f"{explain}, after {window:,} claims"))
                print(table_state(conn))
        return result
    finally:
        dbs.drop(name)


def explain_claim(url: str, queues: list[str], label: str) -> str:
    """The claim of 100 tasks as the worker's claims connection runs it (its generic plan, after
    psycopg prepared it), EXPLAIN (ANALYZE, BUFFERS), rolled back."""
    store = Store.pooled(url, worker_connections=True).open(wait=True)
    try:
        with store.db.connection(pool=store.db.claim_pool) as conn:
            sql = store.db.sql["task_claim"]
            params = dict(queues=queues, limit=100, owner="explain", lease_seconds=30, kind_max_attempts=None,
                          park_limit=0, lanes=0)
            for _ in range(6):  # psycopg prepares it from its sixth use; a claim of none locks nothing
                conn.execute(sql, {**params, "limit": 0})
            with conn.transaction(force_rollback=True):
                plan, _, _ = explain_prepared(conn, params, sql, "ANALYZE, BUFFERS")
    finally:
        store.close()
    return f"\n#### The claim of 100 tasks: {label}\n\n```\n{plan}\n```"


def table_state(conn: psycopg.Connection) -> str:
    """The tables' dead rows and autovacuum runs since the copy was made, and their sizes."""
    queued = conn.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'queued'").fetchone()[0]
    lines = ["", f"{queued:,} tasks still queued.", "",
             "| table or index | size | dead rows | autovacuums | autoanalyzes |", "|---|---:|---:|---:|---:|"]
    for name, size, dead, vacuums, analyzes in conn.execute(
            "SELECT relname, pg_size_pretty(pg_total_relation_size(relid)), n_dead_tup, "
            "autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
            "WHERE schemaname = 'skiplock' AND relname IN ('tasks', 'task_events') ORDER BY relname"):
        lines.append(f"| {name} (with its indexes) | {size} | {dead:,} | {vacuums} | {analyzes} |")
    for name, size in conn.execute(
            "SELECT indexrelname, pg_size_pretty(pg_relation_size(indexrelid)) FROM pg_stat_user_indexes "
            "WHERE schemaname = 'skiplock' AND relname = 'tasks' ORDER BY pg_relation_size(indexrelid) DESC"):
        lines.append(f"| {name} | {size} | | | |")
    return "\n".join(lines)


def backlog_section(dbs: Databases, args: argparse.Namespace) -> None:
    queues = [f"q{i}" for i in range(args.queues)]
    # (queued at the start, claims measured): the baseline drained whole; the same number of
    # claims with the backlog queued (the figure); and a long stretch at the backlog
    kinds = [(args.baseline, args.baseline), (args.backlog, args.baseline)]
    if args.window > args.baseline:
        kinds.append((args.backlog, min(args.window, args.backlog)))
    runs: dict[tuple[int, int], list[dict]] = {kind: [] for kind in kinds}
    for rep in range(args.repeat):
        for n, window in kinds:
            last = args.explain and rep == args.repeat - 1 and (n, window) != kinds[1]
            print(f"{window:,} claims of {n:,}, run {rep + 1}/{args.repeat}", file=sys.stderr)
            runs[n, window].append(claim_rate(dbs, n, queues, window, explain=f"{n:,} queued" if last else None))
    base = statistics.median(r["rate"] for r in runs[kinds[0]])
    print(f"\n### Claims by one worker against the backlog ({args.queues} queues, concurrency {CONCURRENCY}, "
          f"median of {args.repeat})\n")
    print("| queued at the start | claims measured | claims/s | each run | vs the baseline |")
    print("|---:|---:|---:|---|---:|")
    for (n, window), results in runs.items():
        rate = statistics.median(r["rate"] for r in results)
        each = ", ".join(f"{r['rate']:,.0f}" for r in results)
        print(f"| {n:,} | {window:,} | {rate:,.0f} | {each} | {rate / base:.2f} |")
    print("\nEach run: claims/s in each tenth of its window; autovacuum/autoanalyze runs on tasks and "
          "task_events during it; the longest-held snapshot seen in its database (every row version it "
          "may see is kept); the load average at its end.\n")
    print("| queued | claims | run | tenths of the window, claims/s | autovacuum/autoanalyze | longest snapshot | load |")
    print("|---:|---:|---:|---|---|---|---|")
    for (n, window), results in runs.items():
        for i, r in enumerate(results, 1):
            tenths = " ".join(f"{x:,.0f}" for x in r["slices"])
            seconds, who = r["snapshot"]
            print(f"| {n:,} | {window:,} | {i} | {tenths} | {r['autovacuums']} | {seconds:.1f} s "
                  f"({who.replace('|', '/')}) | {r['load']} |")


def workers_section(dbs: Databases, args: argparse.Namespace) -> None:
    counts = [int(k) for k in args.workers.split(",")]
    lane_counts = [int(k) for k in args.claim_lanes.split(",")]
    n = args.drain_tasks
    runs: dict[tuple[int, int], list[dict]] = {(lanes, k): [] for lanes in lane_counts for k in counts}
    for rep in range(args.repeat):
        for lanes in lane_counts:
            for k in counts:
                print(f"{k} worker(s), claim lanes {lanes}, run {rep + 1}/{args.repeat}", file=sys.stderr)
                runs[lanes, k].append(drain(dbs, n, k, lanes))
    for lanes in lane_counts:
        workers_table(n, counts, lanes, {k: runs[lanes, k] for k in counts}, args.repeat)


def workers_table(n: int, counts: list[int], lanes: int, runs: dict[int, list[dict]], repeat: int) -> None:
    base = statistics.median(r["steady"] for r in runs[counts[0]])
    print(f"\n### A drain of {n:,} tasks on one queue by several worker processes (concurrency {CONCURRENCY} "
          f"each, SKIPLOCK_CLAIM_LANES={lanes}, median of {repeat})\n")
    print("| processes | tasks/s, first to last completion | each run | from the release | "
          f"vs {counts[0]} | buffers per task | WAL bytes per task | outcomes written again for a row held | "
          "lock waits sampled: row or transaction / extension (samples) |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for k, results in runs.items():
        rate = statistics.median(r["steady"] for r in results)
        each = ", ".join(f"{r['steady']:,.0f}" for r in results)
        print(f"| {k} | {rate:,.0f} | {each} | "
              f"{statistics.median(r['from_release'] for r in results):,.0f} | {rate / base:.2f} | "
              f"{statistics.median(r['buffers'] for r in results):.1f} | {statistics.median(r['wal'] for r in results):,.0f} | "
              f"{statistics.median(r['written_again'] for r in results):.1%} | "
              f"{sum(r['conflicts'] for r in results)} / {sum(r['extensions'] for r in results)} "
              f"({sum(r['samples'] for r in results)}) |")


def drain(dbs: Databases, n: int, k: int, lanes: int) -> dict:
    name, url = dbs.copy(dbs.template(n, ["default"]))
    workers = Workers()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            with held_back(url, "default", workers, k):
                ports = [free_port() for _ in range(k)]
                for port in ports:
                    workers.spawn(url, ["default"], CONCURRENCY,
                                  env={"SKIPLOCK_CLAIM_LANES": str(lanes), "SKIPLOCK_METRICS_PORT": str(port)})
            released = time.time()
            work_before = database_work(conn)
            with LockSampler(url, interval=0.02) as sampler:
                try:
                    wait_completed(conn, workers, n, timeout=120 + n / 200)
                    written_again = sum(scrape(port).get('skiplock_outcome_writes_busy_total{queue="default"}', 0)
                                        for port in ports)
                finally:
                    workers.stop()
            # read once the workers' backends are gone: each reports the last of its counts as it ends
            wait_backends_gone(conn)
            buffers, wal_bytes = (after - before for after, before in zip(database_work(conn), work_before))
            stamps = times(conn, "finished_at")
        waits = [w[1] for w in sampler.waits]
        return {"steady": steady(stamps, 0).per_second, "from_release": n / (stamps[-1] - released),
                "buffers": buffers / n, "wal": wal_bytes / n, "written_again": written_again / n,
                "conflicts": sum(not is_extension(w) for w in waits), "extensions": sum(map(is_extension, waits)),
                "samples": sampler.samples}
    finally:
        dbs.drop(name)


def wait_backends_gone(conn: psycopg.Connection, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchone()[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers' backends still connected {timeout:.0f} s after they stopped")
        time.sleep(0.01)


def database_work(conn: psycopg.Connection) -> tuple[int, int]:
    """Buffers read or found in cache by the database's backends, and WAL bytes written by the
    server: the work of a drain, which, unlike its rate, does not move with the machine's load."""
    return conn.execute("SELECT (SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()), "
                        "       (SELECT wal_bytes FROM pg_stat_wal)::bigint").fetchone()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.backlog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=200_000, help="claims in the long run at the backlog")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4,8", help="worker process counts of the drains")
    parser.add_argument("--drain-tasks", type=int, default=100_000)
    parser.add_argument("--claim-lanes", default="0,2", help="SKIPLOCK_CLAIM_LANES values of the drains")
    parser.add_argument("--only", choices=("backlog", "workers"))
    parser.add_argument("--explain", action="store_true", help="the claim's plans and the tables' state")
    parser.add_argument("--server", metavar="URL", help="a server of yours (default: a throwaway cluster)")
    args = parser.parse_args(argv)
    prepare()
    started = time.monotonic()
    with server(args.server) as url:
        print(f"## Backlog and many workers\n\n{header(url)}")
        dbs = Databases(url)
        try:
            if args.only in (None, "backlog"):
                backlog_section(dbs, args)
            if args.only in (None, "workers"):
                workers_section(dbs, args)
        finally:
            dbs.drop_all()
    print(f"\nTook {time.monotonic() - started:.0f} s; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

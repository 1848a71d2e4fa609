"""What Citus costs skiplock on one machine (issue 36): the same enqueues and drain on a plain
PostgreSQL and on a Citus cluster of a coordinator and two worker nodes with the tables distributed
by queue (`skiplock migrate --distributed`), in one run, alternating. A report, never an assertion:
one machine cannot show what more nodes buy, only what the routing costs; docs/SCALING.md turns
the CPU figures into a model.

    .venv/bin/python -m tests.benchmarks.citus_cost [--tasks 8000] [--rounds 3]

Every server is a throwaway cluster with Postgres's default durability settings (fsync,
synchronous commit, full-page writes, autovacuum on). Each round, on each placement, in a fresh
database: 500 single enqueues on one connection, then `--tasks` tasks over 8 queues in
`enqueue_many` calls of 1,000, then one worker (`--concurrency 100`, the 8 queues) drains them.
The drain's rate runs from the first completion to the last (finished_at); the CPU is the servers'
processes' own (/proc), per task drained, split into the coordinator's and the worker nodes'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import psycopg

import skiplock
from tests.benchmarks.handlers_skiplock import KIND
from tests.benchmarks.queue_drains import Workers, load_average, steady, times
from tests.pgcluster import ThrowawayCluster, _children_of
from tests.support.citus import CITUS_SETTINGS, CitusCluster

DEFAULTS = {"fsync": True, "synchronous_commit": True, "full_page_writes": True, "autovacuum": True}
QUEUES = [f"bench{i}" for i in range(8)]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(server: ThrowawayCluster) -> float:
    """User and system CPU of a server's postmaster and every process it runs now, plus what its
    finished children used (cutime, cstime of the postmaster)."""
    total = 0.0
    pid = server.pid
    for proc in [pid, *_children_of(pid)]:
        try:
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = int(fields[11]) + int(fields[12])
        if proc == pid:
            used += int(fields[13]) + int(fields[14])
        total += used / CLOCK_TICKS
    return total


def measure(url: str, coordinator: ThrowawayCluster, nodes: list[ThrowawayCluster], tasks: int) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        for i in range(500):
            skiplock.enqueue(conn, KIND, {"i": i}, queue=QUEUES[i % len(QUEUES)])
        single = 500 / (time.perf_counter() - started)
        started = time.perf_counter()
        per_queue = tasks // len(QUEUES)
        for queue in QUEUES:
            for start in range(0, per_queue, 1000):
                skiplock.enqueue_many(conn, KIND, [{"i": j} for j in range(start, min(start + 1000, per_queue))],
                                      queue=queue)
        bulk = per_queue * len(QUEUES) / (time.perf_counter() - started)
        total = 500 + per_queue * len(QUEUES)
        before = (cpu_seconds(coordinator), sum(cpu_seconds(n) for n in nodes))
        workers = Workers()
        try:
            workers.spawn(url, QUEUES, 100)
            deadline = time.monotonic() + 600
            while conn.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'").fetchone()[0] < total:
                workers.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("the drain did not end in 10 minutes")
                time.sleep(0.1)
            after = (cpu_seconds(coordinator), sum(cpu_seconds(n) for n in nodes))
        finally:
            workers.stop()
        drain = steady(times(conn, "finished_at"), skip=100).per_second
    return {"single": single, "bulk": bulk, "drain": drain,
            "coordinator_us": (after[0] - before[0]) / total * 1e6,
            "nodes_us": (after[1] - before[1]) / total * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    from skiplock.engine import migrate

    plain = ThrowawayCluster(settings=DEFAULTS).start()
    citus = CitusCluster(nodes=2)
    for server in (citus.coordinator, *citus.nodes):
        server.settings.update({**CITUS_SETTINGS, **DEFAULTS})
    citus.start()
    results: dict[str, list[dict]] = {"plain PostgreSQL": [], "Citus, 2 worker nodes": []}
    print(f"load average at the start: {load_average()}")
    try:
        for round_number in range(opts.rounds):
            order = list(results) if round_number % 2 == 0 else list(reversed(results))
            for placement in order:
                database = f"bench_{round_number}"
                if placement == "plain PostgreSQL":
                    with psycopg.connect(plain.url, autocommit=True) as conn:
                        conn.execute(f"CREATE DATABASE {database}")
                    url = f"postgresql://postgres@127.0.0.1:{plain.port}/{database}"
                    migrate.apply(url, "skiplock")
                    results[placement].append(measure(url, plain, [], opts.tasks))
                else:
                    url = citus.create_database(database)
                    migrate.apply(url, "skiplock")
                    migrate.distribute(url, "skiplock")
                    results[placement].append(measure(url, citus.coordinator, citus.nodes, opts.tasks))
                print(f"round {round_number + 1}, {placement}: {results[placement][-1]}", flush=True)
    finally:
        citus.cleanup()
        plain.cleanup()
    print(f"load average at the end: {load_average()}\n")
    rows = [("enqueue, single (tasks/s)", "single"), ("enqueue, bulk of 1,000 (tasks/s)", "bulk"),
            ("drain, 1 worker (tasks/s)", "drain"), ("coordinator CPU per task (µs)", "coordinator_us"),
            ("worker nodes' CPU per task (µs)", "nodes_us")]
    names = list(results)
    print(f"| row | {names[0]}, each round | median | {names[1]}, each round | median | Citus ÷ plain |")
    print("|---|---|---:|---|---:|---:|")
    for label, key in rows:
        plain_values = [r[key] for r in results[names[0]]]
        citus_values = [r[key] for r in results[names[1]]]
        p, c = statistics.median(plain_values), statistics.median(citus_values)
        ratio = f"{c / p:.2f}" if p else "–"
        print(f"| {label} | {', '.join(f'{v:,.0f}' for v in plain_values)} | {p:,.0f} | "
              f"{', '.join(f'{v:,.0f}' for v in citus_values)} | {c:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()

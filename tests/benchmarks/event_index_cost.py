"""What the event feed's index (migration 0024, task_events_feed) costs each event written: the same
inserts with and without it, alternating, on a throwaway PostgreSQL with the default durability
settings (fsync, synchronous commit, full-page writes, autovacuum on). A report, never an assertion.

    .venv/bin/python -m tests.benchmarks.event_index_cost [--rounds 5] [--batches 200]

Each round empties task_events, checkpoints, then writes `batches` transactions of 1,000 events
each (the size of a settle's batch of outcomes) and times them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from tests.pgcluster import ThrowawayCluster

DEFAULTS = {"fsync": True, "synchronous_commit": True, "full_page_writes": True, "autovacuum": True}
FEED_INDEX = "CREATE INDEX IF NOT EXISTS task_events_feed ON skiplock.task_events (xid, task_id, seq)"


def write_events(conn: psycopg.Connection, batches: int) -> float:
    conn.execute("TRUNCATE skiplock.task_events")
    conn.execute("CHECKPOINT")
    started = time.perf_counter()
    for _ in range(batches):
        conn.execute("INSERT INTO skiplock.task_events (task_id, seq, type, attempt) "
                     "SELECT gen_random_uuid(), 1, 'completed', 1 FROM generate_series(1, 1000)")
    return time.perf_counter() - started


def main() -> None:
    from skiplock.engine import migrate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    opts = parser.parse_args()
    seconds: dict[str, list[float]] = {"with the index": [], "without": []}
    with ThrowawayCluster(settings=DEFAULTS) as pg:
        migrate.apply(pg.url, "skiplock")
        with psycopg.connect(pg.url, autocommit=True) as conn:
            for round_number in range(opts.rounds):
                order = list(seconds) if round_number % 2 == 0 else list(reversed(seconds))
                for side in order:
                    conn.execute(FEED_INDEX if side == "with the index" else
                                 "DROP INDEX IF EXISTS skiplock.task_events_feed")
                    seconds[side].append(write_events(conn, opts.batches))
    events = opts.batches * 1000
    print(f"| index | seconds for {events:,} events, each round | median | µs per event |")
    print("|---|---|---:|---:|")
    for side, values in seconds.items():
        median = statistics.median(values)
        print(f"| {side} | {', '.join(f'{v:.2f}' for v in values)} | {median:.2f} | {median / events * 1e6:.2f} |")
    ratio = statistics.median(seconds["with the index"]) / statistics.median(seconds["without"])
    print(f"\nwith ÷ without: {ratio:.2f}")


if __name__ == "__main__":
    main()

"""How long a signal takes to reach the handler that waits for it (issue 33): from the send's
commit to the waiting handler's return, one send at a time, each to its own waiting task, on the
database's clock at both ends. A report, never an assertion.

The time of the commit is read inside the sender's transaction just before its COMMIT, so each
figure includes the commit itself; the handler (tests/support/durable_handlers.py, d.signal)
records its return in public.executions (clock_timestamp()) just before returning.

    .venv/bin/python -m tests.benchmarks.signal_latency [--sends 200] [--server URL]

starts one worker (concurrency 10) on a fresh database of the server (SKIPLOCK_TEST_DATABASE_URL,
127.0.0.1:5432, or a throwaway cluster) and prints p50, p99 and max; on a quiet machine. The
reliability suite prints the same figures for a smaller run (tests/reliability/test_durable_faults.py).
"""

from __future__ import annotations

import argparse
import math
import uuid
from dataclasses import dataclass

import psycopg

import skiplock
from tests.support.harness import scalar, wait_for

KIND = "d.signal"  # tests/support/durable_handlers.py


@dataclass(frozen=True)
class SignalLatency:
    sends: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def line(self) -> str:
        return (f"signal send commit -> handler return over {self.sends} sends: p50 {self.p50_ms:.1f} ms, "
                f"p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure(db_url: str, db, sends: int, timeout: float = 30) -> SignalLatency:
    """`sends` waiting tasks (a worker with the d.* handlers must be running on `db_url`), then one
    send at a time, each waited for until its handler returned."""
    prefix = f"latency-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i}" for i in range(sends)]
    ids = skiplock.enqueue_many(db_url, KIND, [{"name": name} for name in names])
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'waiting' "
                                "AND suspended = 'signal'", (ids,)) == sends,
             timeout, message=f"{sends} tasks waiting for their signals")
    seconds = []
    with psycopg.connect(db_url) as conn:
        for task_id, name in zip(ids, names):
            skiplock.send_signal(conn, name, {"task": str(task_id)})
            committing = scalar(conn, "SELECT clock_timestamp()")
            conn.commit()
            returned = wait_for(lambda: scalar(db, "SELECT at FROM public.executions WHERE task_id = %s "
                                                   "AND note = 'returned'", (task_id,)),
                                timeout, interval=0.001, message=f"the handler waiting for {name} to return")
            seconds.append((returned - committing).total_seconds())
    return SignalLatency(sends, 1000 * percentile(seconds, 0.5), 1000 * percentile(seconds, 0.99),
                         1000 * max(seconds))


def main(argv: list[str] | None = None) -> None:
    import os

    from tests import pgcluster
    from tests.conftest import _with_db
    from tests.support.harness import SUPPORT_SCHEMA, ProcessGroup

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=200)
    parser.add_argument("--server", default=os.environ.get(pgcluster.ENV_VAR))
    args = parser.parse_args(argv)

    from skiplock.engine import migrate

    server, cluster = pgcluster.ensure_server(args.server)
    name = f"skiplock_signal_latency_{os.getpid()}"
    group = ProcessGroup()
    try:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = _with_db(server, name)
        migrate.apply(url)
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(SUPPORT_SCHEMA)
            worker = group.spawn(url, "--concurrency", "10", tasks="tests.support.durable_handlers")
            group.wait_ready(worker)
            measure(url, db, 10)  # warm-up: the worker's pool and the handler's connection
            print(measure(url, db, args.sends).line())
    finally:
        group.kill_all()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if cluster is not None:
            cluster.cleanup()


if __name__ == "__main__":
    main()

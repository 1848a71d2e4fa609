"""DBOS Transact's side of tests/benchmarks/durable.py: a workflow of three no-op steps on a queue,
the process that enqueues it and the one DBOS worker process that drains it.

    python -m tests.benchmarks.dbos_app setup URL --tasks N [--worker-concurrency 100] [--polling-interval 0.1]
    python -m tests.benchmarks.dbos_app worker URL

`setup` migrates the system database (DBOS's own migrations, at launch), registers the queue with
its throughput settings and enqueues N workflows with `Queue.enqueue`, dequeuing nothing itself
(`DBOS.listen_queues([])`). DBOS 3.x queues live in the system database: `DBOS.register_queue`
returns the `Queue` (`Queue(...)` is no longer a public constructor), and the worker reads the
queue's settings from there. `worker` launches DBOS and runs what it dequeues until SIGTERM.

Both import this module, so the workflow's name and the application's version agree (a worker
dequeues only its application's workflows of its version). A report's machinery: nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dbos import DBOS, DBOSConfig

APP = "skiplock-bench"
VERSION = "bench-1"  # fixed, so that both processes agree without hashing the source
QUEUE = "bench"
STEPS = 3
# the setup's enqueueing threads: only the setup's time, which is not measured
ENQUEUERS = 8


@DBOS.step()
def noop_step(i: int) -> int:
    return i


@DBOS.workflow(name="three_steps")
def three_steps(n: int) -> int:
    for i in range(STEPS):
        noop_step(i)
    return n


def launch(url: str, *, dequeue: bool) -> None:
    config: DBOSConfig = {
        "name": APP,
        "system_database_url": url,
        "application_version": VERSION,
        "executor_id": f"bench-{os.getpid()}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    if not dequeue:
        DBOS.listen_queues([])
    DBOS.launch()


def setup(url: str, tasks: int, worker_concurrency: int, polling_interval: float) -> None:
    launch(url, dequeue=False)
    try:
        queue = DBOS.register_queue(QUEUE, worker_concurrency=worker_concurrency,
                                    polling_interval_sec=polling_interval, on_conflict="always_update")
        started = time.perf_counter()
        with ThreadPoolExecutor(ENQUEUERS) as pool:
            for _ in pool.map(lambda n: queue.enqueue(three_steps, n), range(tasks)):
                pass
        print(f"enqueued {tasks:,} workflows in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    finally:
        DBOS.destroy()


def worker(url: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    launch(url, dequeue=True)
    try:
        stop.wait()
    finally:
        DBOS.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.dbos_app", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("setup", "worker"))
    parser.add_argument("url")
    parser.add_argument("--tasks", type=int, default=0)
    parser.add_argument("--worker-concurrency", type=int, default=100)
    parser.add_argument("--polling-interval", type=float, default=0.1)
    args = parser.parse_args(argv)
    if args.mode == "setup":
        setup(args.url, args.tasks, args.worker_concurrency, args.polling_interval)
    else:
        worker(args.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())

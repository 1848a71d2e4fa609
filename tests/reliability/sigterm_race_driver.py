"""Driver for test_sigterm_race.py (run as its own process: it installs signal handlers).

Runs the real `Worker.run()` of skiplock, with the real `install_signal_handlers`, against a real
database, over and over: each round the worker claims one task (its only slot is then full),
wake-ups rain on it as on a busy system (the listener's callback, called as fast as a thread can),
and a real SIGTERM arrives. Every round must end with run() returning 0.

A round that never ends is caught by faulthandler, which prints every thread's stack and exits 1.
Prints "ok <rounds>" on success.

Usage: python -m tests.reliability.sigterm_race_driver DATABASE_URL SECONDS_OF_ROUNDS WATCHDOG_SECONDS
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import threading
import time

import psycopg

import skiplock
import tests.support.handlers  # noqa: F401 - registers t.record
from skiplock.engine.lifecycle import Stop, install_signal_handlers
from skiplock.engine.settings import Settings
from skiplock.engine.store import Store
from skiplock.worker.worker import Worker


def main() -> int:
    url, seconds, watchdog = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    os.environ["SKIPLOCK_DATABASE_URL"] = url  # t.record records through it
    faulthandler.dump_traceback_later(watchdog, exit=True)
    # hand the GIL over more often than the default 5 ms, so that the claim loop is more often
    # interrupted in the middle of a statement (stress, not a change of behaviour)
    sys.setswitchinterval(1e-4)
    store = Store.pooled(url, max_size=6).open(wait=True)
    settings = Settings(database_url=url, concurrency=1, lease_seconds=3, heartbeat_seconds=1,
                        shutdown_grace_seconds=0.1, poll_seconds=1.0, reclaim_seconds=60)
    rounds = 0
    end = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True) as db:
        while time.monotonic() < end:
            task_id = skiplock.enqueue(url, "t.record", {"sleep": 2})
            stop = Stop()
            install_signal_handlers(stop)
            worker = Worker(settings, store, stop=stop)

            def storm() -> None:
                # wait for the handler to be running: the worker is full, every wake-up finds
                # nothing to claim and the claim loop goes round at once
                while not stop.is_set() and not db_has_execution(task_id):
                    time.sleep(0.002)
                signal_at = time.monotonic() + random.uniform(0.005, 0.05)
                signalled = False
                while not stop.is_set():
                    worker.claimer.on_notify("default")  # what the listener does on each NOTIFY
                    if not signalled and time.monotonic() >= signal_at:
                        os.kill(os.getpid(), signal.SIGTERM)
                        signalled = True

            def db_has_execution(tid) -> bool:
                with psycopg.connect(url, autocommit=True) as conn:
                    return conn.execute("SELECT count(*) FROM public.executions WHERE task_id = %s",
                                        (tid,)).fetchone()[0] > 0

            thread = threading.Thread(target=storm, daemon=True)
            thread.start()
            code = worker.run()
            thread.join(10)
            if code != 0:
                print(f"round {rounds}: run() returned {code}", flush=True)
                return 1
            db.execute("DELETE FROM skiplock.tasks")
            rounds += 1
    faulthandler.cancel_dump_traceback_later()
    store.close()
    print(f"ok {rounds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`skiplock dev` (what `make dev` runs), against a real Postgres: it migrates, runs every role in one
process, drains its demo workload, serves the API without auth, prints progress, and stops
cleanly on Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import urllib.request

from tests.support.harness import free_port, scalar, wait_exit, wait_for


def test_dev_runs_the_demo_to_the_end_serves_the_api_and_stops_on_ctrl_c(db_url, db, processes):
    api_port = free_port()
    dev = processes.spawn(db_url, command="dev", env={"SKIPLOCK_DEV_API_PORT": api_port})

    enqueued = wait_for(lambda: re.search(r"enqueued (\d+) demo tasks", dev.log()), 60,
                        message="the demo workload enqueued")
    demo_tasks = int(enqueued.group(1))
    assert demo_tasks > 0

    def finished() -> bool:
        if not dev.alive():
            raise AssertionError(f"skiplock dev exited early:\n{dev.log()[-3000:]}")
        return scalar(db, "SELECT count(*) FILTER (WHERE state IN ('completed', 'failed')) >= %s "
                          "AND count(*) FILTER (WHERE state IN ('queued', 'running')) = 0 "
                          "FROM skiplock.tasks WHERE kind LIKE 'demo.%%'", (demo_tasks,))

    wait_for(finished, 90, interval=0.5, message=f"{demo_tasks} demo tasks finished")
    # demo.flaky fails half its attempts on purpose: one may spend all five (1 in 32); nothing else fails
    failed = db.execute("SELECT kind, attempts, last_error FROM skiplock.tasks WHERE state = 'failed'").fetchall()
    assert all(kind == "demo.flaky" and attempts == 5 and "503" in error for kind, attempts, error in failed), failed
    # the progress line shows the drained workload
    wait_for(lambda: re.search(r"\[skiplock dev\] queued 0 · running 0 · completed \d+", dev.log()), 10,
             message="a progress line with nothing left")

    # the API answers without a token (dev runs it with auth disabled)
    with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/v1/tasks?limit=5", timeout=5) as response:
        assert response.status == 200
        page = json.loads(response.read())
    assert len(page["tasks"]) == 5
    # the worker claims on a connection of its own, as `skiplock worker` does
    assert scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skiplock-dev-claims'") == 1

    dev.signal(signal.SIGINT)
    code, _ = wait_exit(dev, 40)
    assert code == 0, dev.log()[-3000:]
    assert '"worker stopped"' in dev.log()

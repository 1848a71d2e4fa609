"""Postgres restarted under a worker that is draining 2,000 tasks: the worker rides it out by
itself (reconnects its pool and its listener), and every task still ends completed. And a
Postgres stopped for a while writes three lines in the worker's log, not one per attempt.

This test restarts a server of its own (ThrowawayCluster): the session's server is never touched."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

import skiplock
from skiplock.engine import migrate
from tests.pgcluster import ThrowawayCluster
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for

TASKS = 2_000


@pytest.fixture
def cluster():
    with ThrowawayCluster() as pg:
        yield pg


def draining(cluster, processes, kind: str, tasks: int, lease: int):
    """A migrated database on the cluster, `tasks` tasks of `kind` (10 ms or less each), and a
    worker draining them; returns (worker, completed), completed() counting the completed."""
    url = cluster.url
    migrate.apply(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    skiplock.enqueue_many(url, kind, [{"sleep": 0.005}] * tasks)
    worker = processes.spawn(url, "--concurrency", "8", env={"SKIPLOCK_LEASE_SECONDS": lease})
    processes.wait_ready(worker)

    def completed() -> int:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            return scalar(conn, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")
    return worker, completed


def test_worker_survives_a_postgres_restart_mid_drain(cluster, processes):
    url = cluster.url
    worker, completed = draining(cluster, processes, "t.record", TASKS, 30)
    wait_for(lambda: completed() >= 300, 30, interval=0.02, message="300 completed tasks")
    old_pid = cluster.pid
    cluster.restart("fast")
    assert cluster.pid != old_pid
    at_restart = completed()
    assert at_restart < TASKS, "the drain ended before the restart: nothing was tested"

    wait_for(lambda: completed() == TASKS, 60, interval=0.2, message=f"all {TASKS} tasks completed")

    with psycopg.connect(url, autocommit=True) as db:
        assert scalar(db, "SELECT count(*) FROM skiplock.tasks") == TASKS
        assert harness.state_counts(db) == {"completed": TASKS}
        # every task ran, and none ran twice: nothing was reclaimed, leases were never lost
        assert scalar(db, "SELECT count(DISTINCT task_id) FROM public.executions") == TASKS
        assert scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks") == 0
        assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE lease_owner IS NOT NULL") == 0
    assert worker.alive(), worker.log()[-3000:]
    wait_for(lambda: harness.http_status(worker.metrics_port, "/readyz") == 200, 10, message="ready again")
    wait_for(lambda: metric(worker.metrics_port, "skiplock_listener_healthy", role="worker") == 1, 15,
             message="the listener back up")


OUTAGE_TASKS, OUTAGE_SECONDS = 3_000, 8.0


def log_lines(text: str) -> list[dict]:
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            lines.append({"level": "raw", "msg": line})  # anything not ours (a library's print) counts too
    return lines


def test_an_outage_is_three_lines_and_the_drain_finishes(cluster, processes):
    """One line when the database goes away (with what the worker holds), a reminder every 30 s
    while it lasts, one when it answers again (issue 35). Before, a 42 s outage wrote 1,261 lines in
    one worker: the claim loop, the heartbeat, the listener and three pools logged every attempt.
    t.nap touches no database, so no handler's own failure is in the log."""
    worker, completed = draining(cluster, processes, "t.nap", OUTAGE_TASKS, 60)
    wait_for(lambda: completed() >= 200, 30, interval=0.02, message="200 completed tasks")
    before = len(log_lines(worker.log()))
    cluster.stop("fast")
    time.sleep(OUTAGE_SECONDS)
    cluster.start()
    wait_for(lambda: completed() == OUTAGE_TASKS, 90, interval=0.2, message=f"all {OUTAGE_TASKS} tasks completed")
    # the line back comes after a second of answers with no failure (engine/outage.py)
    wait_for(lambda: any(line.get("msg") == "database reachable again" for line in log_lines(worker.log())[before:]),
             15, message="the line that the database is back")
    time.sleep(2)  # a second outage's line, if the restart made one, would be in by now

    during = log_lines(worker.log())[before:]
    loud = [line for line in during if line.get("level") in ("warning", "error", "critical", "raw")]
    messages = [line["msg"] for line in loud]
    assert messages.count("database unreachable; retrying") == 1, messages
    assert messages.count("database reachable again") == 1, messages
    # nothing else at warning or above: no attempt-by-attempt lines of any path or pool
    assert set(messages) == {"database unreachable; retrying", "database reachable again"}, messages
    gone = next(line for line in loud if line["msg"] == "database unreachable; retrying")
    assert "claims" in gone and "outcomes_pending" in gone, gone  # what the worker holds meanwhile
    back = next(line for line in loud if line["msg"] == "database reachable again")
    assert OUTAGE_SECONDS - 1 <= back["seconds"] <= OUTAGE_SECONDS + 30, back
    assert worker.alive(), worker.log()[-3000:]

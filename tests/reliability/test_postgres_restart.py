"""Postgres restarted under a worker that is draining 2,000 tasks: the worker rides it out by
itself (reconnects its pool and its listener), and every task still ends completed.

This test restarts a server of its own (ThrowawayCluster): the session's server is never touched."""

from __future__ import annotations

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


def test_worker_survives_a_postgres_restart_mid_drain(cluster, processes):
    url = cluster.url
    migrate.apply(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    skiplock.enqueue_many(url, "t.record", [{"sleep": 0.005}] * TASKS)

    worker = processes.spawn(url, "--concurrency", "8", env={"SKIPLOCK_LEASE_SECONDS": 30})
    processes.wait_ready(worker)

    def completed() -> int:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            return scalar(conn, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")

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

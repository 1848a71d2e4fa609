"""The seed article's livelock: handlers that run longer than the lease. Without heartbeats every
claim expires mid-run, is reclaimed and run again, forever. With heartbeats (lease/4 here) a
3 s task keeps its 1.5 s lease: no reclaim, one execution each."""

from __future__ import annotations

import skiplock
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for


def test_tasks_twice_as_long_as_the_lease_run_once_thanks_to_heartbeats(db_url, db, processes):
    ids = skiplock.enqueue_many(db_url, "t.record", [{"sleep": 3}] * 24)
    worker = processes.spawn(db_url, "--concurrency", "8", env={
        "SKIPLOCK_LEASE_SECONDS": 1.5, "SKIPLOCK_HEARTBEAT_SECONDS": 0.4,
        "SKIPLOCK_REAPER_SECONDS": 0.5,  # a reclaim on the watch: any lapse of a lease is reclaimed
        "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1})
    processes.wait_ready(worker)

    # 3 rounds of 8 x 3 s
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == 24, 30,
             interval=0.1, message="24 completed tasks")

    assert harness.state_counts(db) == {"completed": 24}
    assert scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks") == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE type = 'reclaimed'") == 0
    assert scalar(db, "SELECT count(*) FROM public.executions") == 24
    assert sorted(r[0] for r in db.execute("SELECT task_id FROM public.executions")) == sorted(ids)
    assert db.execute("SELECT DISTINCT attempt FROM public.executions").fetchall() == [(1,)]
    # each run really outlived the lease it was first given
    assert scalar(db, "SELECT min(extract(epoch FROM finished_at - started_at)) FROM skiplock.tasks") >= 2.9
    samples = harness.scrape(worker.metrics_port)
    assert not metric(samples, "skiplock_task_reclaims_total")
    assert not metric(samples, "skiplock_stale_writes_rejected_total")
    assert metric(samples, "skiplock_tasks_finished_total", outcome="completed") == 24

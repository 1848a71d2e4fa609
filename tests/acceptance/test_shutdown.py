"""SIGTERM on a real worker: stop claiming, let short handlers finish within the grace, give the
rest back without consuming an attempt, exit 0. A second SIGTERM gives up draining at once."""

from __future__ import annotations

import signal

import skiplock
from tests.support import harness
from tests.support.harness import scalar, wait_for


def _events(db, task_id) -> list[str]:
    return [r[0] for r in db.execute("SELECT type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                                     (task_id,))]


def _running_executions(db, ids) -> int:
    return scalar(db, "SELECT count(DISTINCT task_id) FROM public.executions WHERE task_id = ANY(%s)", (ids,))


def test_sigterm_drains_short_tasks_releases_long_ones_and_claims_nothing_more(db_url, db, processes):
    lease, grace = 6, 2
    # 3 short + 3 long fill the 6 slots; the backlog (lower priority) must never be claimed: the
    # short ones free their slots after the signal, and a worker that kept claiming would take it
    # Short tasks last 1 s (not 0.3 s) so that the signal surely lands while they still run.
    short = skiplock.enqueue_many(db_url, "t.record", [{"sleep": 1.0}] * 3, priority=5)
    long = skiplock.enqueue_many(db_url, "t.record", [{"sleep": 30}] * 3, priority=5)
    backlog = skiplock.enqueue_many(db_url, "t.record", [{"sleep": 0.1}] * 3, priority=-1)
    # a 30 s poll: the exit must not wait for the claim loop's next poll
    worker = processes.spawn(db_url, "--concurrency", "6", env={
        "SKIPLOCK_LEASE_SECONDS": lease, "SKIPLOCK_HEARTBEAT_SECONDS": 1,
        "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": grace, "SKIPLOCK_POLL_SECONDS": 30})
    processes.wait_ready(worker)
    wait_for(lambda: _running_executions(db, short + long) == 6, 15, interval=0.01,
             message="the 6 tasks to be running")

    signalled_at = harness.db_clock(db)
    worker.signal(signal.SIGTERM)
    # work arriving after the signal (with its NOTIFY) must not be claimed either
    late = skiplock.enqueue(db_url, "t.record", {"sleep": 0.1}, priority=10)
    code, waited = harness.wait_exit(worker, grace + 10)

    assert code == 0, worker.log()[-3000:]
    assert waited < grace + 3, f"exited {waited:.1f}s after SIGTERM (grace {grace}s)"
    assert harness.state_counts(db) == {"completed": 3, "queued": 7}

    for task_id in short:
        assert _events(db, task_id) == ["queued", "running", "completed"]
    # ...and they finished during the drain, not before the signal
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = ANY(%s) AND type = 'completed' "
                      "AND at > %s", (short, signalled_at)) == 3

    for task_id in long:
        state, attempts, owner, lease_until = db.execute(
            "SELECT state, attempts, lease_owner, lease_until FROM skiplock.tasks WHERE id = %s",
            (task_id,)).fetchone()
        assert (state, attempts, owner, lease_until) == ("queued", 0, None, None)
        assert _events(db, task_id) == ["queued", "running", "released"]

    for task_id in backlog + [late]:
        assert _events(db, task_id) == ["queued"]
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state IN ('running', 'cancelling')") == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE type = 'running' AND at > %s",
                  (signalled_at,)) == 0
    assert scalar(db, "SELECT count(*) FROM public.executions WHERE at > %s", (signalled_at,)) == 0
    assert scalar(db, "SELECT count(*) FROM public.executions") == 6


def test_second_sigterm_releases_at_once(db_url, db, processes):
    grace = 20
    long = skiplock.enqueue_many(db_url, "t.record", [{"sleep": 30}] * 2)
    worker = processes.spawn(db_url, "--concurrency", "2", env={
        "SKIPLOCK_LEASE_SECONDS": 30, "SKIPLOCK_HEARTBEAT_SECONDS": 2,
        "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": grace})
    processes.wait_ready(worker)
    wait_for(lambda: _running_executions(db, long) == 2, 15, message="both tasks running")

    worker.signal(signal.SIGTERM)
    wait_for(lambda: '"msg": "draining"' in worker.log(), 10, message="the worker to start draining")
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    code, waited = harness.wait_exit(worker, grace + 10)

    assert code == 0, worker.log()[-3000:]
    assert waited < 3, f"exited {waited:.1f}s after the second SIGTERM; the grace is {grace}s"
    assert harness.state_counts(db) == {"queued": 2}
    for task_id in long:
        assert db.execute("SELECT attempts, lease_owner FROM skiplock.tasks WHERE id = %s",
                          (task_id,)).fetchone() == (0, None)
        assert _events(db, task_id) == ["queued", "running", "released"]


def test_sigterm_on_an_idle_worker_exits_at_once_even_with_a_long_poll(db_url, db, processes):
    worker = processes.spawn(db_url, env={"SKIPLOCK_POLL_SECONDS": 30})
    processes.wait_ready(worker)
    wait_for(lambda: harness.metric(worker.metrics_port, "skiplock_listener_healthy", role="worker") == 1, 10,
             message="listener healthy")
    worker.signal(signal.SIGTERM)
    code, waited = harness.wait_exit(worker, 40)
    assert code == 0, worker.log()[-3000:]
    assert waited < 3, f"an idle worker took {waited:.1f}s to exit after SIGTERM"
    assert '"msg": "worker stopped"' in worker.log()

"""A frozen worker (SIGSTOP) loses its lease; another worker reclaims and completes the task; when
the zombie wakes up (SIGCONT), its late completion is refused by the lease fence."""

from __future__ import annotations

import signal

import skiplock
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for

ENV = {"SKIPLOCK_LEASE_SECONDS": 2, "SKIPLOCK_HEARTBEAT_SECONDS": 0.5, "SKIPLOCK_REAPER_SECONDS": 0.5,
       "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1}


def test_zombie_worker_completion_is_refused_after_its_lease_was_reclaimed(db_url, db, processes):
    zombie_refused_and_counted(db_url, db, processes)


def zombie_refused_and_counted(db_url, db, processes) -> None:
    """The scenario, on the database of `db_url` (tests/distributed runs it on Citus too)."""
    a = processes.spawn(db_url, "--concurrency", "2", env=ENV)
    processes.wait_ready(a)
    task_id = skiplock.enqueue(db_url, "t.whoami", {"sleep": 4})
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s AND pid = %s",
                            (task_id, a.pid)), 10, interval=0.01, message="worker A to start the task")
    a.signal(signal.SIGSTOP)
    first_token = scalar(db, "SELECT lease_token FROM skiplock.tasks WHERE id = %s", (task_id,))

    # A is frozen: its lease runs out (heartbeats stopped); nothing is reclaimed while no reclaim runs
    wait_for(lambda: scalar(db, "SELECT lease_until < clock_timestamp() FROM skiplock.tasks WHERE id = %s",
                            (task_id,)), 10, message="A's lease to expire")
    b = processes.spawn(db_url, "--concurrency", "2", env=ENV)
    processes.wait_ready(b)
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "completed",
             20, message="worker B to reclaim and complete the task")
    wait_for(lambda: metric(b.metrics_port, "skiplock_tasks_finished_total", outcome="completed") == 1, 5,
             message="B to count its completion")

    a.signal(signal.SIGCONT)
    # A's handler wakes, returns, and its outcome (or its next heartbeat) meets the fence
    wait_for(lambda: (metric(a.metrics_port, "skiplock_stale_writes_rejected_total") or 0) >= 1, 15,
             message="A to count a stale write rejected")
    samples = harness.scrape(a.metrics_port)
    rejected = {op: metric(samples, "skiplock_stale_writes_rejected_total", operation=op)
                for op in ("completed", "complete", "heartbeat")}
    assert sum(v or 0 for v in rejected.values()) >= 1, rejected
    assert not metric(samples, "skiplock_tasks_finished_total", outcome="completed")
    # the row is still B's: A's late write changed nothing
    state, result, reclaims, attempts, token = db.execute(
        "SELECT state, result, reclaims, attempts, lease_token FROM skiplock.tasks WHERE id = %s",
        (task_id,)).fetchone()
    assert state == "completed"
    assert result["pid"] == b.pid, result
    assert (reclaims, attempts) == (1, 1)
    assert token > first_token
    events = db.execute("SELECT type, lease_token FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                        (task_id,)).fetchall()
    assert [e[0] for e in events] == ["queued", "running", "reclaimed", "running", "completed"]
    assert events[-1][1] == token  # the completion was written under B's lease
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = %s AND type = 'completed'",
                  (task_id,)) == 1
    assert db.execute("SELECT pid FROM public.executions WHERE task_id = %s ORDER BY at",
                      (task_id,)).fetchall() == [(a.pid,), (b.pid,)]
    assert a.alive() and b.alive()

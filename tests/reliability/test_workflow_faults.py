"""Workflows under faults (issue 21): a fan-in of 500 parents while workers are SIGKILLed runs its
dependent exactly once, after the last parent, seeing 500 outcomes; a handler that spawns children
and is zombied (SIGSTOP past its lease, then SIGCONT) leaves exactly one set of children, the live
run's."""

from __future__ import annotations

import random
import signal
import time

import skiplock
from tests.support.harness import metric, scalar, wait_for

LEASE, HEARTBEAT, RECLAIM = 3, 1, 1
ENV = {"SKIPLOCK_LEASE_SECONDS": LEASE, "SKIPLOCK_HEARTBEAT_SECONDS": HEARTBEAT,
       "SKIPLOCK_REAPER_SECONDS": RECLAIM, "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 2}
PARENTS = 500


def test_a_fan_in_of_500_runs_once_after_the_last_parent_while_workers_are_killed(db_url, db, processes):
    rng = random.Random(21)

    def spawn():
        proc = processes.spawn(db_url, "--concurrency", "4", env=ENV)
        processes.wait_ready(proc)
        return proc

    workers = [spawn() for _ in range(3)]
    # about 4 s of work for the 12 slots: the storm has parents to hit
    parents = skiplock.enqueue_many(db_url, "t.value", [{"n": 1, "sleep": rng.uniform(0.05, 0.15)}
                                                        for _ in range(PARENTS)])
    report = skiplock.enqueue(db_url, "t.parents", {}, depends_on=parents)
    killed = 0
    for _ in range(4):
        time.sleep(1.0)  # a kill every second: the pace is the scenario
        if scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (report,)) != "waiting":
            break
        victim = rng.choice(workers)
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        killed += 1
        workers.remove(victim)
        workers.append(spawn())
    assert killed >= 2, "the parents were done before the storm: nothing was tested"

    done = skiplock.wait(db_url, report, 120)
    assert done.state == "completed"
    assert done.result["parents"] == PARENTS and done.result["sum"] == PARENTS
    assert done.result["states"] == ["completed"]
    assert scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s", (report,)) == 1
    last_parent_end = scalar(db, "SELECT max(finished_at) FROM skiplock.tasks WHERE id = ANY(%s)", (parents,))
    assert scalar(db, "SELECT min(at) FROM public.executions WHERE task_id = %s", (report,)) > last_parent_end
    assert scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks WHERE id = ANY(%s)", (parents,)) >= 1
    print(f"killed {killed}; reclaims {scalar(db, 'SELECT sum(reclaims) FROM skiplock.tasks')}")


def test_a_zombie_s_children_never_appear(db_url, db, processes):
    env = {"SKIPLOCK_LEASE_SECONDS": 2, "SKIPLOCK_HEARTBEAT_SECONDS": 0.5, "SKIPLOCK_REAPER_SECONDS": 0.5,
           "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1}
    a = processes.spawn(db_url, "--concurrency", "2", env=env)
    processes.wait_ready(a)
    task_id = skiplock.enqueue(db_url, "t.spawn", {"n": 10, "sleep": 4})
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s AND pid = %s",
                            (task_id, a.pid)), 10, interval=0.01, message="worker A to start the task")
    a.signal(signal.SIGSTOP)
    wait_for(lambda: scalar(db, "SELECT lease_until < clock_timestamp() FROM skiplock.tasks WHERE id = %s",
                            (task_id,)), 10, message="A's lease to expire")
    b = processes.spawn(db_url, "--concurrency", "2", env=env)
    processes.wait_ready(b)
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "completed",
             20, message="worker B to reclaim and complete the task")
    a.signal(signal.SIGCONT)
    wait_for(lambda: (metric(a.metrics_port, "skiplock_stale_writes_rejected_total") or 0) >= 1, 15,
             message="A's late outcome to be refused")
    children = db.execute("SELECT payload->>'pid', count(*) FROM skiplock.tasks WHERE kind = 't.noop' "
                          "GROUP BY 1").fetchall()
    assert children == [(str(b.pid), 10)]
    # the siblings' chain: one child without a parent, nine waiting for the one before
    assert scalar(db, "SELECT count(*) FROM skiplock.task_dependencies") == 9
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 't.noop' "
                                "AND state = 'completed'") == 10, 20, message="the 10 children to run")

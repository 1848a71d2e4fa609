"""kill -9 of workers while 5,000 tasks drain: every task still completes, and a task runs again
only after its lease was reclaimed (executions - 1 <= reclaims), never twice under one lease."""

from __future__ import annotations

import random
import signal
import time

import skiplock
from tests.support import harness
from tests.support.harness import scalar, wait_for

TASKS = 5_000
LEASE, HEARTBEAT, RECLAIM = 3, 1, 1
ENV = {"SKIPLOCK_LEASE_SECONDS": LEASE, "SKIPLOCK_HEARTBEAT_SECONDS": HEARTBEAT,
       "SKIPLOCK_REAPER_SECONDS": RECLAIM, "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 2}


def test_kill_9_workers_mid_drain_loses_nothing_and_reruns_only_reclaimed_tasks(db_url, db, processes):
    rng = random.Random()
    # ~12 tasks run at once: 30 ms each keeps the drain going well past the four kills
    skiplock.enqueue_many(db_url, "t.record", [{"sleep": 0.03}] * TASKS)

    def spawn():
        proc = processes.spawn(db_url, "--concurrency", "4", env=ENV)
        processes.wait_ready(proc)
        return proc

    workers = [spawn() for _ in range(3)]
    killed = []
    for _ in range(4):
        # a kill about every second: that pace is the scenario, not a wait for some condition
        time.sleep(1.0)
        victim = rng.choice([w for w in workers if w.alive()])
        # only count it as a kill mid-drain if it is running something right now
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'running' "
                                    "AND lease_owner LIKE %s", (f"%:{victim.pid}:%",)) > 0,
                 10, interval=0.01, message=f"worker {victim.pid} to hold a claim")
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        killed_at = time.monotonic()
        killed.append(victim.pid)
        workers.remove(victim)
        workers.append(spawn())
    remaining_at_last_kill = scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state <> 'completed'")

    # the dead hold nothing once their leases ran out and a reclaim passed (lease + reclaim interval,
    # plus a little slack for a loaded machine)
    def held_by_the_dead():
        return scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state IN ('running', 'cancelling') "
                          "AND split_part(lease_owner, ':', 2)::int = ANY(%s)", (killed,))

    wait_for(lambda: held_by_the_dead() == 0, LEASE + RECLAIM + 3 - (time.monotonic() - killed_at),
             message="claims of killed workers to be reclaimed")

    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == TASKS,
             90, interval=0.2, message=f"all {TASKS} tasks completed")

    print(f"remaining at last kill: {remaining_at_last_kill}, killed: {killed}")
    assert remaining_at_last_kill > 0, "the drain ended before the last kill: nothing was tested"
    assert harness.state_counts(db) == {"completed": TASKS}
    assert all(w.alive() for w in workers)
    # every killed worker had run tasks, and its lost claims were reclaimed
    for pid in killed:
        assert scalar(db, "SELECT count(*) FROM public.executions WHERE pid = %s", (pid,)) > 0
    total_reclaims = scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks")
    assert total_reclaims >= len(killed)

    rows = db.execute("""
        SELECT t.id, t.reclaims, count(e.task_id) AS executions
        FROM skiplock.tasks t LEFT JOIN public.executions e ON e.task_id = t.id
        GROUP BY t.id, t.reclaims""").fetchall()
    assert len(rows) == TASKS
    never_ran = [r for r in rows if r[2] == 0]
    assert never_ran == []
    too_many = [r for r in rows if r[2] - 1 > r[1]]
    assert too_many == [], f"{len(too_many)} tasks ran more often than they were reclaimed: {too_many[:5]}"
    reruns = sum(r[2] - 1 for r in rows)
    print(f"reclaims {total_reclaims}, reruns {reruns}")
    assert 0 < reruns <= total_reclaims
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE lease_owner IS NOT NULL") == 0

"""Schedules on the distributed placement: three scheduler processes against one Citus cluster fire
a schedule of 0.2 s exactly once per nominal time (schedules and their fires are reference tables,
the tasks they enqueue are routed to their queue's node), every fire's task carrying the fire's
idempotency key, and a worker runs each once."""

from __future__ import annotations

import datetime as dt

import pytest

from skiplock.engine.schedule_actions import apply_schedules
from skiplock.engine.schedules import Schedule
from skiplock.engine.store import Store
from tests.acceptance.test_scheduler_process import _check_consecutive, _key, _outcomes
from tests.distributed.test_distributed_faults import fresh  # noqa: F401  (the fixture)
from tests.support.harness import scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")

NAME, QUEUE = "ticks", "ticks"


def fired(db) -> list[tuple[dt.datetime, str]]:
    """(nominal time, its task's idempotency key) of each fire, oldest first (two reads: a join of
    the reference table of fires to the distributed tasks on a task's id is not one Citus routes)."""
    fires = db.execute("SELECT nominal_at, task_id FROM skiplock.schedule_fires WHERE schedule = %s "
                       "AND outcome = 'fired' ORDER BY nominal_at", (NAME,)).fetchall()
    keys = dict(db.execute("SELECT id, idempotency_key FROM skiplock.tasks WHERE queue = %s", (QUEUE,)).fetchall())
    return [(nominal, keys.get(task_id)) for nominal, task_id in fires]


def test_three_schedulers_fire_each_nominal_time_once_and_a_worker_runs_each_task_once(fresh, processes):  # noqa: F811
    url, db = fresh
    store = Store.pooled(url, max_size=2).open(wait=True)
    try:
        apply_schedules(store, [Schedule(NAME, "t.record", queue=QUEUE, interval_seconds=0.2, overlap="allow",
                                         catchup="all")])
    finally:
        store.close()
    schedulers = [processes.spawn(url, command="scheduler") for _ in range(3)]
    for proc in schedulers:
        processes.wait_ready(proc)
    worker = processes.spawn(url, "--concurrency", "4", "--queues", QUEUE)
    processes.wait_ready(worker)
    wait_for(lambda: len(fired(db)) >= 15, 30, interval=0.2, message="15 fires")
    db.execute("UPDATE skiplock.schedules SET enabled = false WHERE name = %s", (NAME,))
    fires = fired(db)
    _check_consecutive(fires, dt.timedelta(seconds=0.2))
    assert [key for _, key in fires] == [_key(NAME, nominal) for nominal, _ in fires]
    assert _outcomes(db, NAME) == {"fired": len(fires)}
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = %s", (QUEUE,)) == len(fires)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = %s AND state = 'completed'",
                            (QUEUE,)) == len(fires), 30, message="every fire's task completed")
    assert scalar(db, "SELECT count(*) FROM public.executions") == len(fires)
    assert all(proc.alive() for proc in schedulers)
    for proc in schedulers:
        assert "could not" not in proc.log() and "not supported" not in proc.log(), proc.log()[-2000:]

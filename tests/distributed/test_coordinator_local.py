"""skiplock in a Citus database with its tables on the coordinator: the placement pg-boss supports
on Citus, and the one every Citus cluster (Azure Cosmos DB for PostgreSQL among them) can take
today. `skiplock migrate` runs as on plain Postgres, the tables stay local to the coordinator
(none is distributed or a reference table, so no shard and no two-phase commit), and the seed
scenario runs there: 200 tasks through two real worker processes, each run exactly once, each
with its queued, running and completed events.

Distributing the tables by queue over the worker nodes is docs/SCALING.md's "Past one primary"
and is not done yet: that section lists what Citus refused when it was tried."""

from __future__ import annotations

import pytest

import skiplock
from tests.support.harness import scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")

TASKS = 200


def test_skiplock_migrates_and_runs_each_task_once_on_a_citus_coordinator(citus, citus_db, processes):
    assert scalar(citus_db, "SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND isactive") == 3
    assert scalar(citus_db, "SELECT count(*) FROM pg_dist_node WHERE groupid <> 0") == 2
    # every skiplock table is the coordinator's own: Citus knows none of them
    tables = {name for (name,) in citus_db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'skiplock'")}
    assert {"tasks", "task_events", "schedules", "workers", "webhook_deliveries"} <= tables
    assert scalar(citus_db, "SELECT count(*) FROM citus_tables WHERE table_name::text LIKE 'skiplock.%%'") == 0

    ids = skiplock.enqueue_many(citus.url, "t.record", [{"sleep": 0.01}] * TASKS)
    assert len(set(ids)) == TASKS
    workers = [processes.spawn(citus.url, "--concurrency", "4") for _ in range(2)]
    for worker in workers:
        processes.wait_ready(worker)
    wait_for(lambda: scalar(citus_db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == TASKS,
             60, message=f"{TASKS} tasks completed")
    assert scalar(citus_db, "SELECT count(*) FROM public.executions") == TASKS
    assert scalar(citus_db, "SELECT count(DISTINCT task_id) FROM public.executions") == TASKS
    events = dict(citus_db.execute("SELECT type, count(*) FROM skiplock.task_events GROUP BY type").fetchall())
    assert events == {"queued": TASKS, "running": TASKS, "completed": TASKS}
    # both workers took part, each claiming on the coordinator
    assert scalar(citus_db, "SELECT count(DISTINCT pid) FROM public.executions") == 2

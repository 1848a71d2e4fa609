"""Faults on the distributed placement (Citus, a coordinator and two worker nodes): a frozen
worker's late write refused and counted, workers killed
with SIGKILL mid-drain (nothing lost, a task runs again only after its lease was reclaimed), a
worker stopped with SIGTERM mid-drain (it finishes what it holds and exits 0), and a worker node
stopped mid-drain (its queues wait, neither lost nor run twice, while the other node's go on; the
node back, everything completes)."""

from __future__ import annotations

import random
import signal
import time

import psycopg
import pytest

import skiplock
from tests.support import harness
from tests.support.harness import SUPPORT_SCHEMA, scalar, wait_for
from tests.support.kill_storm import Workers
from tests.distributed.test_distributed_placement import migrate, node_of_queue
from tests.reliability.test_zombie_fencing import zombie_refused_and_counted

pytestmark = pytest.mark.xdist_group("citus")

QUEUES = [f"q{i}" for i in range(8)]
LEASE, HEARTBEAT, RECLAIM = 3, 1, 1
ENV = {"SKIPLOCK_LEASE_SECONDS": LEASE, "SKIPLOCK_HEARTBEAT_SECONDS": HEARTBEAT,
       "SKIPLOCK_REAPER_SECONDS": RECLAIM, "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 2}


@pytest.fixture
def fresh(citus, request):
    """A database of this test's own on the cluster, migrated with --distributed."""
    name = f"skiplock_{request.node.name[:40].lower()}"
    url = citus.create_database(name)
    done = migrate(url, "--distributed")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SUPPORT_SCHEMA)
        yield url, conn


def spawn(processes, url, concurrency: int = 4):
    worker = processes.spawn(url, "--concurrency", str(concurrency), "--queues", ",".join(QUEUES), env=ENV)
    processes.wait_ready(worker)
    return worker


def enqueue_everywhere(url: str, per_queue: int, payload: dict) -> list:
    ids = []
    for queue in QUEUES:
        ids += skiplock.enqueue_many(url, "t.record", [payload] * per_queue, queue=queue)
    return ids


def test_workers_killed_mid_drain_lose_nothing_and_rerun_only_reclaimed_tasks(fresh, processes):
    url, db = fresh
    total = len(QUEUES) * 150
    ids = enqueue_everywhere(url, 150, {"sleep": 0.03})
    workers = Workers(processes, url, db, 3, ENV, "tests.support.handlers", args=("--queues", ",".join(QUEUES)))
    killed = workers.storm(3, lambda: False, random.Random())
    assert killed == 3
    remaining = scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state <> 'completed'")
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == total,
             120, interval=0.2, message=f"all {total} tasks completed")
    print(f"remaining at the last kill: {remaining}, killed: {workers.killed}")
    assert remaining > 0, "the drain ended before the last kill: nothing was tested"
    assert harness.state_counts(db) == {"completed": total}
    rows = db.execute("""
        SELECT t.id, t.reclaims, count(e.task_id) FROM skiplock.tasks AS t
        LEFT JOIN public.executions AS e ON e.task_id = t.id GROUP BY t.id, t.reclaims""").fetchall()
    assert len(rows) == total and {r[0] for r in rows} == set(ids)
    assert [r for r in rows if r[2] == 0] == []
    too_many = [r for r in rows if r[2] - 1 > r[1]]
    assert too_many == [], f"{len(too_many)} tasks ran more often than they were reclaimed: {too_many[:5]}"
    reclaims = scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks")
    assert reclaims >= killed
    print(f"reclaims {reclaims}, reruns {sum(r[2] - 1 for r in rows)}")


def test_a_frozen_workers_late_completion_is_refused_by_the_fence_and_counted(fresh, processes):
    """tests/reliability/test_zombie_fencing.py's scenario through real workers on Citus: a worker
    frozen past its lease, the task reclaimed and completed by another, the zombie's late write
    refused and counted in skiplock_stale_writes_rejected_total."""
    url, db = fresh
    zombie_refused_and_counted(url, db, processes)


def test_sigterm_mid_drain_finishes_what_it_holds_and_exits_0(fresh, processes):
    url, db = fresh
    total = len(QUEUES) * 20
    enqueue_everywhere(url, 20, {"sleep": 0.2})
    worker = spawn(processes, url, concurrency=8)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") >= 20, 30,
             message="the drain under way")
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'running'") == 0
    done = scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")
    assert 20 <= done < total
    spawn(processes, url, concurrency=8)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == total, 60,
             message="the rest completed by a second worker")
    assert scalar(db, "SELECT count(*) FROM public.executions") == total  # each ran once


def test_a_worker_node_stopped_mid_drain_stops_its_queues_only_and_its_tasks_complete_when_it_is_back(
        citus, fresh, processes):
    url, db = fresh
    nodes = {queue: node_of_queue(db, queue) for queue in QUEUES}
    lost = citus.nodes[0]
    lost_queues = [q for q, port in nodes.items() if port == lost.port]
    kept_queues = [q for q in QUEUES if q not in lost_queues]
    assert lost_queues and kept_queues
    per_queue = 60
    total = len(QUEUES) * per_queue
    enqueue_everywhere(url, per_queue, {"sleep": 0.05})
    worker = spawn(processes, url, concurrency=4)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions") >= 40, 30, message="the drain under way")
    lost.stop("immediate")
    stopped_at = time.monotonic()
    try:
        # the other node's queues drain to the end while the node is away (a read naming them is
        # routed to their node alone)
        wait_for(lambda: _completed(db, kept_queues) == len(kept_queues) * per_queue, 60, interval=0.5,
                 message="the other node's queues completed while the node is away")
        ran_while_away = scalar(db, "SELECT count(*) FROM public.executions")
        assert worker.alive()
    finally:
        lost.start()
    print(f"node {lost.port} away {time.monotonic() - stopped_at:.1f} s; {ran_while_away} of {total} ran meanwhile")
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == total, 90,
             interval=0.5, message="every task completed once the node is back")
    rows = db.execute("""
        SELECT t.id, t.reclaims, count(e.task_id) FROM skiplock.tasks AS t
        LEFT JOIN public.executions AS e ON e.task_id = t.id GROUP BY t.id, t.reclaims""").fetchall()
    assert len(rows) == total
    assert [r for r in rows if r[2] == 0] == []
    assert [r for r in rows if r[2] - 1 > r[1]] == []  # none ran twice without a reclaim
    # each of the node's queues: one line when it stopped answering, one when it answered again
    log = worker.log()
    away, back = log.count("a queue's node does not answer"), log.count("a queue's node answers again")
    assert away == back >= len(lost_queues), log[-3000:]


def test_while_a_worker_node_is_away_a_killed_workers_tasks_on_the_other_node_are_reclaimed_and_complete(
        citus, fresh, processes):
    url, db = fresh
    nodes = {queue: node_of_queue(db, queue) for queue in QUEUES}
    lost = citus.nodes[1]
    kept_queues = [q for q, port in nodes.items() if port != lost.port]
    ids = []
    for queue in QUEUES:  # the lost node's queues hold tasks too: their claims fail meanwhile
        ids += skiplock.enqueue_many(url, "t.record", [{"sleep": 0.5}] * 6, queue=queue)
    kept = [i for i, in db.execute("SELECT id FROM skiplock.tasks WHERE queue = ANY(%s)", (kept_queues,)).fetchall()]
    lost.stop("immediate")
    try:
        first = spawn(processes, url, concurrency=4)
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = ANY(%s) AND state = 'running'",
                                (kept_queues,)) >= 2, 30, interval=0.05, message="tasks of the other node running")
        first.popen.send_signal(signal.SIGKILL)
        first.popen.wait(10)
        held = scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = ANY(%s) AND state = 'running'",
                      (kept_queues,))
        spawn(processes, url, concurrency=4)
        # the reclaim reads each node for its queues: the node away does not hold the other's back
        wait_for(lambda: _completed(db, kept_queues) == len(kept), 60, interval=0.5,
                 message="the other node's tasks, the killed worker's among them, completed while the node is away")
        reclaims = scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks WHERE queue = ANY(%s)", (kept_queues,))
        assert held >= 2 and reclaims == held, (held, reclaims)
        rows = db.execute("""
            SELECT t.id, t.reclaims, count(e.task_id) FROM skiplock.tasks AS t
            LEFT JOIN public.executions AS e ON e.task_id = t.id WHERE t.queue = ANY(%s)
            GROUP BY t.id, t.reclaims""", (kept_queues,)).fetchall()
        assert len(rows) == len(kept) and [r for r in rows if r[2] == 0 or r[2] - 1 > r[1]] == []
    finally:
        lost.start()
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == len(ids), 60,
             interval=0.5, message="the lost node's tasks completed once it is back")


def _completed(db: psycopg.Connection, queues: list[str]) -> int:
    return scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = ANY(%s) AND state = 'completed'", (queues,))


def test_the_coordinator_restarted_mid_drain_the_workers_come_back_and_every_task_completes(
        citus, fresh, processes):
    url, db = fresh
    total = len(QUEUES) * 40
    enqueue_everywhere(url, 40, {"sleep": 0.05})
    worker = spawn(processes, url, concurrency=4)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions") >= 30, 30, message="the drain under way")
    db.close()
    # fast: every client cut off, transactions in flight rolled back. (An immediate stop here
    # would lose the handlers' last execution rows: the test clusters run without synchronous
    # commit, and those rows live on the coordinator.)
    citus.coordinator.restart("fast")
    with psycopg.connect(url, autocommit=True) as again:
        wait_for(lambda: scalar(again, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == total, 120,
                 interval=0.5, message="every task completed after the coordinator's restart")
        rows = again.execute("""
            SELECT t.id, t.reclaims, count(e.task_id) FROM skiplock.tasks AS t
            LEFT JOIN public.executions AS e ON e.task_id = t.id GROUP BY t.id, t.reclaims""").fetchall()
    assert worker.alive()
    assert len(rows) == total and [r for r in rows if r[2] == 0] == []
    assert [r for r in rows if r[2] - 1 > r[1]] == []  # none ran twice without a reclaim


def test_a_queues_shard_moved_to_the_other_node_while_it_drains_loses_and_repeats_nothing(citus, fresh, processes):
    url, db = fresh
    queue = QUEUES[0]
    source = node_of_queue(db, queue)
    target = next(node.port for node in citus.nodes if node.port != source)
    ids = skiplock.enqueue_many(url, "t.record", [{"sleep": 0.02}] * 400, queue=queue)
    worker = spawn(processes, url, concurrency=4)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions") >= 40, 30, message="the drain under way")
    shard = scalar(db, "SELECT get_shard_id_for_distribution_column('skiplock.tasks', %s::text)", (queue,))
    # the shard group (the queue's tasks, events and steps) moves; writes to it wait meanwhile
    db.execute("SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s, "
               "shard_transfer_mode => 'block_writes')", (shard, source, target))
    moved_at = scalar(db, "SELECT count(*) FROM public.executions")
    assert node_of_queue(db, queue) == target
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = %s AND state = 'completed'",
                            (queue,)) == len(ids), 90, interval=0.5, message="the queue drained on its new node")
    print(f"shard {shard} moved from {source} to {target} after {moved_at} of {len(ids)} ran")
    assert moved_at < len(ids), "the drain ended before the move: nothing was tested"
    rows = db.execute("""
        SELECT t.id, t.reclaims, count(e.task_id) FROM skiplock.tasks AS t
        LEFT JOIN public.executions AS e ON e.task_id = t.id WHERE t.queue = %s GROUP BY t.id, t.reclaims""",
                      (queue,)).fetchall()
    assert len(rows) == len(ids) and [r for r in rows if r[2] == 0] == []
    assert [r for r in rows if r[2] - 1 > r[1]] == []
    assert worker.alive()

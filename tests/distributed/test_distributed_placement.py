"""skiplock with its tables distributed by queue over two Citus worker nodes
(`skiplock migrate --distributed`, engine/sql/placement.sql and routed.sql): the placement as Citus
records it, queues landing on both nodes, the seed scenario through real worker processes with
each node's queues claimed on that node's shards, stale writes refused after a reclaim, and
idempotency keys under concurrent enqueues. What does not run on this placement yet is refused in
one line (docs/SCALING.md)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psycopg
import pytest

import skiplock
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store
from tests.integration.test_unique import _run_threads
from tests.support.harness import ROOT, SUPPORT_SCHEMA, child_environment, scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")

DATABASE = "skiplock_distributed"
# the seed scenario's queues: hashed to shards on both worker nodes (asserted below)
QUEUES = [f"q{i}" for i in range(8)]
TASKS_PER_QUEUE = 25


def migrate(url: str, *args: str) -> subprocess.CompletedProcess:
    return cli(url, "migrate", *args)


def cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skiplock.cli", *args], capture_output=True, text=True,
                          env=child_environment(SKIPLOCK_DATABASE_URL=url, PYTHONPATH=str(ROOT / "services")),
                          timeout=120)


@pytest.fixture(scope="module")
def distributed(citus):
    """A database of its own, migrated with --distributed, and the support tables (local to the
    coordinator: the handlers record their executions there)."""
    url = citus.create_database(DATABASE)
    done = migrate(url, "--distributed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "distributed by queue"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SUPPORT_SCHEMA)
        yield url, conn


def node_of_queue(conn: psycopg.Connection, queue: str) -> int:
    """The port of the worker node holding `queue`'s shard of the tasks table."""
    return scalar(conn, "SELECT nodeport FROM citus_shards WHERE shardid = "
                        "get_shard_id_for_distribution_column('skiplock.tasks', %s::text)", (queue,))


def test_the_placement_distributes_by_queue_and_makes_the_small_tables_reference_tables(citus, distributed):
    url, db = distributed
    kinds = dict(db.execute("SELECT table_name::text, citus_table_type FROM citus_tables "
                            "WHERE table_name::text LIKE 'skiplock.%%'").fetchall())
    distributed_tables = ("skiplock.tasks", "skiplock.task_events", "skiplock.task_steps", "skiplock.task_dependencies")
    assert {name for name, kind in kinds.items() if kind == "distributed"} == set(distributed_tables)
    assert sum(1 for kind in kinds.values() if kind == "reference") == 13
    # colocated: a queue's tasks, events, steps and the edges from its tasks on one shard group
    assert scalar(db, "SELECT count(DISTINCT colocation_id) FROM citus_tables WHERE table_name::text = ANY(%s)",
                  (list(distributed_tables),)) == 1
    shards_per_node = dict(db.execute("SELECT nodeport, count(*) FROM citus_shards "
                                      "WHERE table_name = 'skiplock.tasks'::regclass GROUP BY nodeport").fetchall())
    assert sorted(shards_per_node) == sorted(node.port for node in citus.nodes)
    assert len(set(shards_per_node.values())) == 1  # as many on each
    again = migrate(url, "--distributed")
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "already distributed by queue"


def test_distributed_on_a_postgres_without_citus_is_one_line(db_url):
    done = migrate(db_url, "--distributed")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "skiplock migrate: --distributed needs the citus extension in this database: CREATE EXTENSION citus "
        "here and on every worker node, and add the nodes (citus_add_node), first"]


def test_the_seed_scenario_runs_each_task_once_with_each_nodes_queues_claimed_on_its_shards(
        citus, distributed, processes):
    url, db = distributed
    db.execute("TRUNCATE public.executions")
    nodes = {queue: node_of_queue(db, queue) for queue in QUEUES}
    assert set(nodes.values()) == {node.port for node in citus.nodes}, nodes  # queues on both nodes
    updates_before = {node.port: _shard_updates(citus, node.port) for node in citus.nodes}
    ids = []
    for queue in QUEUES:
        ids += skiplock.enqueue_many(url, "t.record", [{"sleep": 0.01}] * TASKS_PER_QUEUE, queue=queue)
    total = len(QUEUES) * TASKS_PER_QUEUE
    assert len(set(ids)) == total
    workers = [processes.spawn(url, "--concurrency", "4", "--queues", ",".join(QUEUES)) for _ in range(2)]
    for worker in workers:
        processes.wait_ready(worker)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'completed'",
                            (ids,)) == total, 90, message=f"{total} tasks completed")
    assert scalar(db, "SELECT count(*) FROM public.executions") == total
    assert scalar(db, "SELECT count(DISTINCT task_id) FROM public.executions") == total
    events = dict(db.execute("SELECT type, count(*) FROM skiplock.task_events WHERE task_id = ANY(%s) GROUP BY type",
                             (ids,)).fetchall())
    assert events == {"queued": total, "running": total, "completed": total}
    # each node holds its queues' tasks, and their claims and outcomes were written on its shards
    for node in citus.nodes:
        mine = [q for q, port in nodes.items() if port == node.port]
        held = _node_tasks(citus, db, node.port)
        assert {q: n for q, n in held.items() if q in QUEUES} == {q: TASKS_PER_QUEUE for q in mine}
        # every task was updated twice on its node, the claim and the outcome (the node's backends
        # report their statistics within seconds of going idle)
        wait_for(lambda: _shard_updates(citus, node.port) - updates_before[node.port] >= 2 * TASKS_PER_QUEUE * len(mine),
                 30, interval=0.5, message=f"node {node.port}'s shards updated by the claims and outcomes")
    for worker in workers:
        assert "could not" not in worker.log(), worker.log()[-2000:]


def _node_tasks(citus, db: psycopg.Connection, port: int) -> dict[str, int]:
    """{queue: tasks} as a worker node's own shards of the tasks table hold them (tasks_<shard id>)."""
    shards = [f"skiplock.tasks_{shard}" for (shard,) in db.execute(
        "SELECT shardid FROM citus_shards WHERE table_name = 'skiplock.tasks'::regclass AND nodeport = %s", (port,))]
    union = " UNION ALL ".join(f"SELECT queue FROM {shard}" for shard in shards)
    with psycopg.connect(citus.node_url(port, DATABASE), autocommit=True) as conn:
        return dict(conn.execute(f"SELECT queue, count(*) FROM ({union}) AS rows GROUP BY queue").fetchall())


def _shard_updates(citus, port: int) -> int:
    """Rows updated in a worker node's shards of the tasks table, from the node's own statistics."""
    with psycopg.connect(citus.node_url(port, DATABASE), autocommit=True) as conn:
        conn.execute("SET citus.show_shards_for_app_name_prefixes = '*'")  # Citus hides shards otherwise
        return scalar(conn, "SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables "
                            "WHERE schemaname = 'skiplock' AND relname ~ '^tasks_[0-9]+$'")


def test_a_stale_outcome_after_a_reclaim_is_refused_and_the_new_claim_fences_it(distributed):
    url, db = distributed
    store = Store.pooled(url, max_size=2).open(wait=True)
    try:
        task_id = skiplock.enqueue(url, "t.record", {}, queue="fenced")
        [first] = store.tasks.task_claim(["fenced"], 1, "zombie", 0.5)
        time.sleep(1.0)
        [reclaimed] = [r for r in store.tasks.task_reclaim_expired(max_reclaims=5) if r.id == task_id]
        assert reclaimed.state == "queued"
        [second] = store.tasks.task_claim(["fenced"], 1, "live", 30.0)
        assert second.id == task_id and second.lease_token == first.lease_token + 1
        # the zombie's heartbeat and outcome are refused; the live claim's stand
        assert store.tasks.task_heartbeat([(task_id, first.lease_token, "fenced")], 30.0) == {}
        stale = Settlement(task_id, first.lease_token, "completed", queue="fenced")
        assert store.tasks.task_settle([stale]) == {}
        assert store.tasks.task_settle([Settlement(task_id, second.lease_token, "failed", error="boom",
                                                   queue="fenced")]) == {task_id: "failed"}
        types = [t for (t,) in db.execute("SELECT type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                                          (task_id,))]
        assert types == ["queued", "running", "reclaimed", "running", "failed"]
    finally:
        store.close()


def in_threads(enqueue_all, threads: int = 8) -> list:
    """Every id `enqueue_all(thread)` returned, run in `threads` threads released at once
    (test_unique's runner), none failing."""
    found: list = []
    lock = threading.Lock()

    def collect(thread: int) -> None:
        mine = enqueue_all(thread)
        with lock:
            found.extend(mine)

    assert _run_threads(collect, threads) == []
    return found


def test_concurrent_enqueues_of_ten_idempotency_keys_make_ten_tasks(distributed):
    url, db = distributed
    found = in_threads(lambda thread: [
        skiplock.enqueue(url, "t.record", {"thread": thread}, queue="keyed", idempotency_key=f"key-{i % 10}")
        for i in range(50)])
    assert len(found) == 400
    assert len(set(found)) == 10
    assert sum(1 for task_id in found if task_id.created) == 10
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = 'keyed'") == 10


def test_bad_enqueues_are_refused_in_one_line_with_nothing_written(distributed):
    url, conn = distributed
    parent = skiplock.enqueue(url, "t.record", {}, queue="refused")
    with pytest.raises(skiplock.InvalidInput, match=r"^unique does not combine with depends_on$"):
        skiplock.enqueue(url, "t.record", {}, queue="refused", depends_on=[parent], unique=skiplock.Unique())
    with pytest.raises(skiplock.InvalidInput, match=r"^depends_on: no task 00000000-0000-0000-0000-000000000000 "):
        skiplock.enqueue(url, "t.record", {}, queue="refused", depends_on=["00000000-0000-0000-0000-000000000000"])
    # nothing of the refused enqueues was written
    assert scalar(conn, "SELECT count(*) FROM skiplock.tasks WHERE queue = 'refused'") == 1


def test_concurrent_enqueues_of_ten_unique_keys_make_ten_tasks_with_their_events(distributed):
    url, db = distributed
    unique = skiplock.Unique(by_payload=["n"], period=3600)

    def enqueue_all(thread: int) -> list:
        mine = [skiplock.enqueue(url, "t.record", {"n": i % 10, "thread": thread}, queue="uniq", unique=unique)
                for i in range(40)]
        return mine + skiplock.enqueue_many(url, "t.record", [{"n": i, "thread": thread} for i in range(10)],
                                            queue="uniq", unique=unique)

    found = in_threads(enqueue_all)
    assert len(found) == 8 * 50
    assert len(set(found)) == 10
    assert sum(1 for task_id in found if task_id.created) == 10
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = 'uniq'") == 10
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE queue = 'uniq' AND type = 'queued'") == 10


def test_concurrent_debounced_enqueues_of_ten_keys_merge_into_ten_tasks_bounded_by_max_wait(distributed):
    url, db = distributed

    def enqueue_all(thread: int) -> list:
        return [skiplock.enqueue(url, "t.record", {"key": i % 10, "thread": thread, "i": i}, queue="debounced",
                                 debounce=skiplock.Debounce(key=f"k{i % 10}", delay=30, max_wait=60))
                for i in range(50)]

    found = in_threads(enqueue_all)
    assert len(found) == 8 * 50 and len(set(found)) == 10
    assert sum(1 for task_id in found if task_id.created) == 10
    rows = db.execute("SELECT debounce_key, payload, run_after, debounce_until, id, "
                      "extract(epoch FROM debounce_until - created_at) FROM skiplock.tasks "
                      "WHERE queue = 'debounced' ORDER BY debounce_key").fetchall()
    assert [r[0] for r in rows] == [f"k{i}" for i in range(10)]
    # each holds one enqueue's payload of its key, and starts 30 s after the last merge, within
    # max_wait of its first enqueue
    assert all(r[1]["key"] == int(r[0][1:]) for r in rows)
    assert all(r[2] <= r[3] and 59 <= r[5] <= 60 for r in rows), rows
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE queue = 'debounced' AND type = 'queued'") == 10
    # one more merge takes the payload, and moves the start no further than debounce_until
    later = skiplock.enqueue(url, "t.record", {"key": 0, "late": True}, queue="debounced",
                             debounce=skiplock.Debounce(key="k0", delay=3600))
    assert later == rows[0][4] and not later.created
    payload, run_after = db.execute("SELECT payload, run_after FROM skiplock.tasks WHERE id = %s", (later,)).fetchone()
    assert payload == {"key": 0, "late": True} and run_after == rows[0][3]


def test_the_queues_and_kinds_enqueued_are_recorded_once_committed_and_a_rollback_records_none(distributed):
    """queue_kinds (what the filters and the console know of) is written by the enqueue here; a
    process remembers only pairs it found committed, so a rolled-back first enqueue hides nothing."""
    url, db = distributed
    with psycopg.connect(url) as conn:
        skiplock.enqueue(conn, "t.record", {}, queue="rolled")
        conn.rollback()
    assert scalar(db, "SELECT count(*) FROM skiplock.queue_kinds WHERE queue = 'rolled'") == 0
    first, second = (skiplock.enqueue(url, "t.record", {"n": n}, queue="rolled") for n in range(2))
    assert db.execute("SELECT queue, kind FROM skiplock.queue_kinds WHERE queue = 'rolled'").fetchall() == \
        [("rolled", "t.record")]
    store = Store.pooled(url)
    store.open(wait=True)
    try:
        assert {t.id for t in store.tasks.task_list(queue="rolled", kind="t.record")} == {first, second}
    finally:
        store.close()


def test_a_limit_is_refused_in_one_line_and_the_placement_waits_for_the_limits_to_go(citus, distributed):
    """No claim serves a limited kind on this placement yet: a limit is refused rather than
    leaving its kind's tasks waiting, and a schema with limits is not distributed until they go."""
    url, db = distributed
    refused = cli(url, "limits", "set", "t.record", "--concurrency", "2")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "skiplock limits: limits do not run on a distributed (Citus) placement yet: the tasks of a limited kind "
        "would wait for good"], refused.stderr
    assert scalar(db, "SELECT count(*) FROM skiplock.limits") == 0
    other = citus.create_database("skiplock_limited")
    assert migrate(other).returncode == 0
    assert cli(other, "limits", "set", "t.record", "--concurrency", "2").returncode == 0
    held = migrate(other, "--distributed")
    assert held.returncode == 1 and held.stderr.strip().splitlines() == [
        "skiplock migrate: limits do not run on a distributed (Citus) placement yet: the tasks of a limited kind "
        "would wait for good; delete the limits first (skiplock limits delete t.record)"], held.stderr
    with psycopg.connect(other, autocommit=True) as conn:
        assert scalar(conn, "SELECT count(*) FROM pg_dist_partition") == 0  # nothing distributed
    assert cli(other, "limits", "delete", "t.record").returncode == 0
    done = migrate(other, "--distributed")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "distributed by queue", done.stderr


def test_retention_deletes_finished_tasks_with_their_events_queue_by_queue(distributed):
    url, db = distributed
    store = Store.pooled(url, max_size=2).open(wait=True)
    try:
        old = {queue: skiplock.enqueue_many(url, "t.record", [{}] * 5, queue=queue) for queue in ("ret-a", "ret-b")}
        recent = skiplock.enqueue_many(url, "t.record", [{}] * 3, queue="ret-a")
        claims = store.tasks.task_claim(["ret-a", "ret-b"], 20, "w", 30.0)
        assert len(claims) == 13
        assert set(store.tasks.task_settle([Settlement(c.id, c.lease_token, "completed", queue=c.queue)
                                            for c in claims]).values()) == {"completed"}
        doomed = old["ret-a"] + old["ret-b"]
        db.execute("UPDATE skiplock.tasks SET finished_at = now() - interval '2 hours' "
                   "WHERE queue IN ('ret-a', 'ret-b') AND id = ANY(%s)", (doomed,))
        assert store.tasks.task_delete_finished("completed", 3600, limit=500) == 10
        assert store.tasks.task_delete_finished("completed", 3600, limit=500) == 0
        left = {r[0] for r in db.execute("SELECT id FROM skiplock.tasks WHERE queue IN ('ret-a', 'ret-b')")}
        assert left == set(recent)
        assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE queue IN ('ret-a', 'ret-b') "
                          "AND task_id = ANY(%s)", (doomed,)) == 0
        assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE queue = 'ret-a' AND task_id = ANY(%s)",
                      (recent,)) == 9
    finally:
        store.close()

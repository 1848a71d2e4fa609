"""Dependencies and fan-in on the distributed placement (store/routed_graph.py): parents and their
dependents in queues on both worker nodes. Real worker processes drain a fan-in of 40 parents, a
chain that crosses the nodes at every link and a failed parent's two kinds of dependents; and one
script of outcomes, cancels and resumes moves a graph exactly as it moves on one Postgres, state,
counters, errors and events alike; skiplock.wait() hears when a task ends."""

from __future__ import annotations

import re
import threading
import time
import uuid

import psycopg
import pytest

import skiplock
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store
from skiplock.engine.store.finished import wait_finished
from tests.distributed.test_distributed_faults import fresh  # noqa: F401
from tests.distributed.test_distributed_placement import QUEUES, node_of_queue
from tests.support.harness import scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")


def test_a_fan_in_a_chain_across_nodes_and_a_failed_parents_dependents_run_in_order(citus, fresh, processes):  # noqa: F811
    url, db = fresh
    nodes = {queue: node_of_queue(db, queue) for queue in QUEUES}
    assert set(nodes.values()) == {node.port for node in citus.nodes}, nodes
    # the fan-in: 40 parents, 5 in each queue, and one task after all of them
    parents = [skiplock.enqueue(url, "t.value", {"n": i}, queue=QUEUES[i % len(QUEUES)]) for i in range(40)]
    fan_in = skiplock.enqueue(url, "t.parents", {}, queue=QUEUES[0], depends_on=parents)
    # a chain whose every link sits on the other node from the one before
    across = [q for q in QUEUES if nodes[q] != nodes[QUEUES[0]]][0]
    chain = [skiplock.enqueue(url, "t.value", {"n": 1}, queue=QUEUES[0])]
    for link in range(1, 6):
        chain.append(skiplock.enqueue(url, "t.value", {"n": 1}, queue=(QUEUES[0], across)[link % 2],
                                      depends_on=[chain[-1]]))
    failing = skiplock.enqueue(url, "t.fail_permanently", {}, queue=QUEUES[1])
    cancelled = skiplock.enqueue(url, "t.parents", {}, queue=QUEUES[2], depends_on=[failing])
    runs_anyway = skiplock.enqueue(url, "t.parents", {}, queue=QUEUES[3], depends_on=[failing],
                                   on_parent_failure="run")
    first = dict(db.execute("SELECT task_id, type FROM skiplock.task_events WHERE seq = 1 AND task_id = ANY(%s)",
                            ([fan_in, cancelled, runs_anyway, *chain[1:]],)).fetchall())
    assert set(first.values()) == {"waiting"} and len(first) == 8

    workers = [processes.spawn(url, "--concurrency", "4", "--queues", ",".join(QUEUES)) for _ in range(2)]
    for worker in workers:
        processes.wait_ready(worker)
    everything = [*parents, fan_in, *chain, failing, cancelled, runs_anyway]
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) "
                                "AND state IN ('completed', 'failed', 'cancelled')", (everything,)) == len(everything),
             90, message="every task of the graph finished")

    states = dict(db.execute("SELECT id, state FROM skiplock.tasks WHERE id = ANY(%s)", (everything,)).fetchall())
    assert [states[t] for t in parents + [fan_in] + chain].count("completed") == 47
    assert (states[failing], states[cancelled], states[runs_anyway]) == ("failed", "cancelled", "completed")
    assert scalar(db, "SELECT last_error FROM skiplock.tasks WHERE id = %s", (cancelled,)) == \
        f"parent {failing} ended failed"
    # the fan-in saw its 40 parents completed, with their results
    result = scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (fan_in,))
    assert (result["parents"], result["states"], result["sum"]) == (40, ["completed"], sum(range(40)))
    assert scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (runs_anyway,))["states"] == ["failed"]
    # each ran once (the cancelled dependent never), and none before its parents had finished
    runs = dict(db.execute("SELECT task_id, count(*) FROM public.executions GROUP BY task_id").fetchall())
    assert runs == {t: 1 for t in everything if t != cancelled}
    started = dict(db.execute("SELECT task_id, min(at) FROM public.executions GROUP BY task_id").fetchall())
    finished = dict(db.execute("SELECT id, finished_at FROM skiplock.tasks WHERE id = ANY(%s)", (everything,)).fetchall())
    assert started[fan_in] >= max(finished[p] for p in parents)
    assert all(started[child] >= finished[parent] for parent, child in zip(chain, chain[1:]))
    assert started[runs_anyway] >= finished[failing]
    # each dependent was queued by its last parent's end: one event saying so
    reasons = db.execute("SELECT task_id, data ->> 'reason' FROM skiplock.task_events "
                         "WHERE task_id = ANY(%s) AND seq = 2", ([fan_in, *chain[1:], runs_anyway],)).fetchall()
    assert sorted(r for _, r in reasons) == ["parent ended"] * 7
    for worker in workers:
        assert "could not" not in worker.log(), worker.log()[-2000:]


# -- one script, both placements

QUEUE_OF = {"a": "qa", "b": "qb", "c": "qc", "d": "qd", "e": "qe", "f": "qf"}
FILTER = dict(queue=None, state=None, kind=None, created_after=None, created_before=None, idempotency_key=None)


def _graph_script(url: str) -> list:
    """The same graph, moved by outcomes, cancels and resumes; a snapshot of every task after each
    step, with the ids written as the tasks' names."""
    store = Store.pooled(url)
    store.open(wait=True)
    ids: dict[str, object] = {}
    try:
        def add(name, parents=(), on_parent_failure="cancel"):
            ids[name] = skiplock.enqueue(url, "t.noop", {}, queue=QUEUE_OF[name],
                                         depends_on=[ids[p] for p in parents] or None,
                                         on_parent_failure=on_parent_failure)

        def settle(name, outcome):
            [claimed] = store.tasks.task_claim([QUEUE_OF[name]], 1, "script", 30)
            assert claimed.id == ids[name]
            store.tasks.task_settle([Settlement(claimed.id, claimed.lease_token, outcome, error=outcome,
                                                queue=QUEUE_OF[name])])

        steps = [
            lambda: (add("a"), add("b"), add("c", "ab"), add("d", "c"), add("e", "a", "run"), add("f", "c", "run")),
            lambda: settle("a", "completed"),
            lambda: settle("b", "failed"),           # c and d cancelled, f queued by its failed parent
            lambda: store.tasks.task_resume(ids["b"]),   # c and d wait again
            lambda: settle("b", "completed"),        # c queued
            lambda: store.tasks.task_cancel(ids["c"]),   # d cancelled again
            lambda: store.tasks.task_resume(ids["c"]),   # d waits again
            lambda: settle("c", "completed"),        # d queued
            lambda: store.tasks.task_cancel_many({**FILTER, "queue": "qe"}, 10),
            lambda: store.tasks.task_retry_many({**FILTER, "state": "cancelled"}, 10),
        ]
        snapshots = []
        with psycopg.connect(url, autocommit=True) as conn:
            for step in steps:
                step()
                snapshots.append(_snapshot(conn, ids))
        return snapshots
    finally:
        store.close()


def _snapshot(conn: psycopg.Connection, ids: dict) -> list:
    names = {str(task_id): name for name, task_id in ids.items()}
    rows = conn.execute("SELECT id, state, waiting_on, failed_parents, cancelled_by_parent, last_error "
                        "FROM skiplock.tasks WHERE id = ANY(%s)", (list(ids.values()),)).fetchall()
    events: dict = {}
    for task_id, kind in conn.execute(
            "SELECT task_id, type || coalesce(':' || (data ->> 'reason'), '') FROM skiplock.task_events "
            "WHERE task_id = ANY(%s) ORDER BY task_id, seq", (list(ids.values()),)).fetchall():
        events.setdefault(task_id, []).append(kind)
    named = re.compile("|".join(map(re.escape, names)))
    return sorted((names[str(r[0])], *r[1:5], named.sub(lambda m: names[m.group(0)], r[5] or ""), events[r[0]])
                  for r in rows)


def test_outcomes_cancels_and_resumes_move_a_graph_as_on_one_postgres(fresh, db_url):  # noqa: F811
    url, _ = fresh
    on_citus, on_postgres = _graph_script(url), _graph_script(db_url)
    for i, (x, y) in enumerate(zip(on_citus, on_postgres)):
        assert [r for r in x if r not in y] == [r for r in y if r not in x], i
    assert on_citus == on_postgres
    final = {row[0]: row[1:4] for row in on_citus[-1]}
    assert final == {"a": ("completed", 0, 0), "b": ("completed", 0, 0), "c": ("completed", 0, 0),
                     "d": ("queued", 0, 0), "e": ("queued", 0, 0), "f": ("queued", 0, 0)}
    # the steps did move it: c was cancelled by its parent, then by hand, and came back each time
    assert [snap[2][1] for snap in on_citus] == ["waiting", "waiting", "cancelled", "waiting", "queued",
                                                 "cancelled", "queued", "completed", "completed", "completed"]


def test_wait_hears_when_a_task_ends_on_a_worker_node(fresh):  # noqa: F811
    """skiplock.wait() LISTENs for the id of a watched task that ends: sent from the coordinator
    here. Polled once a minute and given 30 s, the wait ends soon after the task only if the
    notification comes."""
    url, _ = fresh
    task_id = skiplock.enqueue(url, "t.noop", {}, queue=QUEUES[1])
    store = Store.pooled(url)
    store.open(wait=True)
    try:
        def settle_soon():
            time.sleep(0.5)
            [claimed] = store.tasks.task_claim([QUEUES[1]], 1, "waited", 30)
            store.tasks.task_settle([Settlement(claimed.id, claimed.lease_token, "completed", result={"n": 3},
                                                queue=QUEUES[1])])

        settling = threading.Thread(target=settle_soon)
        settling.start()
        with psycopg.connect(url, autocommit=True) as conn:
            began = time.monotonic()
            task = wait_finished(conn, "skiplock", task_id, timeout=30, poll=60)
            waited = time.monotonic() - began
        settling.join()
    finally:
        store.close()
    assert (task.id, task.state, task.result) == (task_id, "completed", {"n": 3})
    assert waited < 15, waited  # unheard, it would have read the task again only at its 30 s timeout
    with pytest.raises(skiplock.TaskNotFound), psycopg.connect(url, autocommit=True) as conn:
        wait_finished(conn, "skiplock", uuid.uuid4(), timeout=1, poll=60)


def test_a_parent_whose_dependent_is_on_a_node_away_completes_once_the_node_is_back(citus, fresh, processes):  # noqa: F811
    """A parent's outcome and its dependents' counters commit together: with the dependent's node
    away, the outcome waits (written again, the handler not run again) and the parent's lease is
    kept; the node back, both complete."""
    url, db = fresh
    nodes = {queue: node_of_queue(db, queue) for queue in QUEUES}
    away = citus.nodes[1]
    here = [q for q in QUEUES if nodes[q] != away.port][0]
    there = [q for q in QUEUES if nodes[q] == away.port][0]
    parent = skiplock.enqueue(url, "t.value", {"n": 1, "sleep": 1.5}, queue=here)
    child = skiplock.enqueue(url, "t.parents", {}, queue=there, depends_on=[parent])
    worker = processes.spawn(url, "--concurrency", "2", "--queues", f"{here},{there}")
    processes.wait_ready(worker)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s", (parent,)) == 1, 30,
             interval=0.05, message="the parent running")
    away.stop("immediate")
    try:
        time.sleep(4)  # the handler ended 1.5 s in; its outcome has been refused since
        # (read on the parent's node alone: a read by id asks every node)
        assert scalar(db, "SELECT state FROM skiplock.tasks WHERE queue = %s AND id = %s", (here, parent)) == "running"
    finally:
        away.start()
    wait_for(lambda: _state(db, child) == "completed", 60, interval=0.5, message="the dependent completed")
    assert _state(db, parent) == "completed"
    runs = dict(db.execute("SELECT task_id, count(*) FROM public.executions WHERE task_id = ANY(%s) GROUP BY 1",
                           ([parent, child],)).fetchall())
    assert runs == {parent: 1, child: 1}
    assert scalar(db, "SELECT reclaims FROM skiplock.tasks WHERE id = %s", (parent,)) == 0
    assert scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (child,))["sum"] == 1


def _state(db, task_id) -> str:
    return scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,))

"""Dependencies between tasks (issue 21, migration 0017), at the store: a task with parents waits
until they are final and is queued in the transaction of the last one's outcome; a failed parent
cancels it or lets it run (on_parent_failure); resuming that parent re-arms it; retention keeps a
parent its dependents still need; skiplock.wait returns when a task ends. Real Postgres; worker
processes are tests/acceptance's and tests/reliability's."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import skiplock
from skiplock.engine.errors import InvalidInput, WaitTimeout
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store
from skiplock.engine.task_actions import resume_task
from tests.support.harness import scalar


def state(db, task_id) -> str:
    return scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,))


def run_one(store: Store, outcome: str = "completed", **fields):
    """Claim one task and write `outcome` for it; returns the claimed task."""
    (task,) = store.tasks.task_claim(["default"], 1, "w", 30)
    applied = store.tasks.task_settle([Settlement(task.id, task.lease_token, outcome, **fields)])
    assert task.id in applied
    return task


def test_a_chain_runs_in_order_and_each_sees_its_parent(store, db_url, db):
    a = skiplock.enqueue(db_url, "wf.a", {})
    b = skiplock.enqueue(db_url, "wf.b", {}, depends_on=[a])
    c = skiplock.enqueue(db_url, "wf.c", {}, depends_on=[b])
    assert [state(db, t) for t in (a, b, c)] == ["queued", "waiting", "waiting"]
    assert run_one(store, result={"rows": 3}).id == a
    assert [state(db, t) for t in (b, c)] == ["queued", "waiting"]
    (parent,) = store.tasks.task_parents(b)
    assert (parent.id, parent.kind, parent.state, parent.result) == (a, "wf.a", "completed", {"rows": 3})
    assert run_one(store).id == b
    assert run_one(store).id == c
    events = [r[0] for r in db.execute("SELECT type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq", (c,))]
    assert events == ["waiting", "queued", "running", "completed"]


def test_fan_in_is_released_once_by_the_last_parent(store, db_url, db):
    parents = skiplock.enqueue_many(db_url, "wf.part", [{"i": i} for i in range(50)])
    report = skiplock.enqueue(db_url, "wf.report", {}, depends_on=parents)
    assert scalar(db, "SELECT waiting_on FROM skiplock.tasks WHERE id = %s", (report,)) == 50
    claimed = store.tasks.task_claim(["default"], 100, "w", 30)
    assert sorted(t.id for t in claimed) == sorted(parents)
    for task in claimed[:-1]:
        store.tasks.task_settle([Settlement(task.id, task.lease_token, "completed")])
        assert state(db, report) == "waiting"
    last = claimed[-1]
    store.tasks.task_settle([Settlement(last.id, last.lease_token, "completed")])
    assert state(db, report) == "queued"
    assert len(store.tasks.task_parents(report)) == 50


def test_a_failed_parent_cancels_or_runs_its_dependent_and_resume_re_arms(store, db_url, db):
    a = skiplock.enqueue(db_url, "wf.a", {})
    cancel = skiplock.enqueue(db_url, "wf.b", {}, depends_on=[a])
    run = skiplock.enqueue(db_url, "wf.b", {}, depends_on=[a], on_parent_failure="run")
    run_one(store, "failed", error="boom")
    assert (state(db, cancel), state(db, run)) == ("cancelled", "queued")
    assert scalar(db, "SELECT last_error FROM skiplock.tasks WHERE id = %s", (cancel,)) == f"parent {a} ended failed"
    assert run_one(store).id == run  # the 'run' one ran, and sees the failure
    # resume of the failed parent: the cancelled dependent waits for it again, and runs once after it
    resume_task(store, a, actor="test")
    assert (state(db, a), state(db, cancel)) == ("queued", "waiting")
    assert run_one(store).id == a
    assert state(db, cancel) == "queued"
    assert run_one(store).id == cancel
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = %s AND type = 'running'",
                  (cancel,)) == 1


def test_a_finished_parent_counts_at_once_and_an_unknown_one_writes_nothing(store, db_url, db):
    done = skiplock.enqueue(db_url, "wf.a", {})
    run_one(store)
    failed = skiplock.enqueue(db_url, "wf.a", {})
    run_one(store, "failed", error="no")
    assert state(db, skiplock.enqueue(db_url, "wf.b", {}, depends_on=[done])) == "queued"
    assert state(db, skiplock.enqueue(db_url, "wf.b", {}, depends_on=[done, failed])) == "cancelled"
    assert state(db, skiplock.enqueue(db_url, "wf.b", {}, depends_on=[failed], on_parent_failure="run")) == "queued"
    before = scalar(db, "SELECT count(*) FROM skiplock.tasks")
    with pytest.raises(InvalidInput, match=r"^depends_on: no task [0-9a-f-]{36} \(in schema skiplock\)$"):
        skiplock.enqueue(db_url, "wf.b", {}, depends_on=[done, uuid.uuid4()])
    with pytest.raises(InvalidInput, match=r"^depends_on: 'nope' is not a task id$"):
        skiplock.enqueue(db_url, "wf.b", {}, depends_on=["nope"])
    with pytest.raises(InvalidInput, match=r"^on_parent_failure 'maybe': must be 'cancel' or 'run'$"):
        skiplock.enqueue(db_url, "wf.b", {}, depends_on=[done], on_parent_failure="maybe")
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks") == before
    assert scalar(db, "SELECT count(*) FROM skiplock.task_dependencies") == 4  # 1 + 2 + 1 edges


def test_cancelling_a_waiting_task_and_its_dependents_follow(store, db_url, db):
    a = skiplock.enqueue(db_url, "wf.a", {})
    b = skiplock.enqueue(db_url, "wf.b", {}, depends_on=[a])
    c = skiplock.enqueue(db_url, "wf.c", {}, depends_on=[b])
    assert store.tasks.task_cancel(b) is not None
    assert (state(db, a), state(db, b), state(db, c)) == ("queued", "cancelled", "cancelled")


def test_retention_keeps_a_parent_while_a_dependent_waits(store, db_url, db):
    a = skiplock.enqueue(db_url, "wf.a", {})
    other = skiplock.enqueue(db_url, "wf.a", {})
    b = skiplock.enqueue(db_url, "wf.b", {}, depends_on=[a, other])
    first = run_one(store)
    db.execute("UPDATE skiplock.tasks SET finished_at = now() - interval '1 day' WHERE id = %s", (first.id,))
    assert store.tasks.task_delete_finished("completed", 60) == 0  # b still waits for the other
    run_one(store)
    assert state(db, b) == "queued"
    assert store.tasks.task_delete_finished("completed", 60) == 0  # b has not run yet
    run_one(store)
    assert store.tasks.task_delete_finished("completed", 60) >= 1
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = %s", (first.id,)) == 0


def test_wait_returns_when_the_task_ends_and_raises_on_timeout(store, db_url):
    task_id = skiplock.enqueue(db_url, "wf.a", {})
    with pytest.raises(WaitTimeout, match=r"^task [0-9a-f-]{36} is still queued after 0.2 s$"):
        skiplock.wait(db_url, task_id, 0.2)
    latencies = []
    for _ in range(20):
        task_id = skiplock.enqueue(db_url, "wf.a", {}, queue="waited")
        ended: dict = {}

        def finish():
            time.sleep(random.uniform(0.01, 0.05))
            claimed = []
            while not claimed:  # the waiter's mark of the row may hold it for a moment: SKIP LOCKED
                claimed = store.tasks.task_claim(["waited"], 1, "w", 30)
            (task,) = claimed
            # 'busy' (the waiter held the row for the moment): written again, as the worker does
            while store.tasks.task_settle([Settlement(task.id, task.lease_token, "completed")]).get(task.id) != "completed":
                time.sleep(0.001)
            ended["at"] = time.monotonic()

        thread = threading.Thread(target=finish)
        thread.start()
        done = skiplock.wait(db_url, task_id, 5)
        returned = time.monotonic()
        thread.join()
        assert done.state == "completed"
        latencies.append(returned - ended["at"])
    print(f"wait after completion: max {max(latencies) * 1000:.1f} ms")
    # a notification, not the one-second poll, woke every wait
    assert max(latencies) < 0.5


def _run_dag(store: Store, db, db_url, edges: dict[int, list[int]], fails: set[int], modes: dict[int, str]):
    ids: dict[int, uuid.UUID] = {}
    for node in sorted(edges):
        ids[node] = skiplock.enqueue(db_url, "wf.node", {"n": node}, depends_on=[ids[p] for p in edges[node]],
                                     on_parent_failure=modes[node])
    node_of = {v: k for k, v in ids.items()}
    started: list[int] = []
    for _ in range(200):
        claimed = store.tasks.task_claim(["default"], 5, "w", 30)
        if not claimed:
            break
        random.shuffle(claimed)
        for task in claimed:
            node = node_of[task.id]
            # when a dependent runs, every parent is final
            parents = store.tasks.task_parents(task.id)
            assert all(p.state in ("completed", "failed", "cancelled") for p in parents), (node, parents)
            started.append(node)
            outcome = "failed" if node in fails else "completed"
            store.tasks.task_settle([Settlement(task.id, task.lease_token, outcome, error="x" if node in fails else None)])
    states = dict(db.execute("SELECT id, state FROM skiplock.tasks WHERE id = ANY(%s)", (list(ids.values()),)).fetchall())
    return ids, started, states


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_dags_run_each_dependent_at_most_once_after_its_parents(store, db_url, db, data):
    n = data.draw(st.integers(min_value=1, max_value=30))
    edges = {i: sorted(data.draw(st.sets(st.integers(0, i - 1), max_size=min(i, 4)))) if i else [] for i in range(n)}
    fails = data.draw(st.sets(st.integers(0, n - 1), max_size=n // 3))
    modes = {i: data.draw(st.sampled_from(["cancel", "run"])) for i in range(n)}
    ids, started, states = _run_dag(store, db, db_url, edges, fails, modes)
    assert len(started) == len(set(started))  # at most once
    assert "waiting" not in states.values() and "queued" not in states.values()  # nothing left waiting
    for node, parents in edges.items():
        state_now = states[ids[node]]
        bad_parent = any(states[ids[p]] in ("failed", "cancelled") for p in parents)
        if modes[node] == "cancel" and bad_parent:
            assert state_now == "cancelled" and node not in started
        else:
            assert node in started and all(started.index(p) < started.index(node) for p in parents if p in started)
    db.execute("DELETE FROM skiplock.tasks")

"""Durable execution on the distributed placement (Citus): a run's step records on its task's
shard, fenced by its lease token; a durable sleep, a signal wait and a wait for children in a
queue on the other node, each suspended and woken; and a worker killed mid-run, whose successor
repeats no recorded step. The handlers are tests/support/durable_handlers.py's d.* kinds, run by
real worker processes."""

from __future__ import annotations

import signal

import pytest

import skiplock
from tests.distributed.test_distributed_faults import ENV, fresh  # noqa: F401
from tests.distributed.test_distributed_placement import QUEUES, node_of_queue
from tests.support.harness import scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")

HANDLERS = "tests.support.durable_handlers"


def _notes(db, task_id) -> dict[str, int]:
    return dict(db.execute("SELECT note, count(*) FROM public.executions WHERE task_id = %s GROUP BY note",
                           (task_id,)).fetchall())


def _state(db, task_id) -> str:
    return scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,))


def _events(db, task_id) -> list[tuple]:
    return db.execute("SELECT type, data ->> 'reason' FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                      (task_id,)).fetchall()


def test_steps_sleep_signals_and_awaited_children_suspend_and_resume_on_their_shards(citus, fresh, processes):  # noqa: F811
    url, db = fresh
    nodes = {queue: node_of_queue(db, queue) for queue in [*QUEUES, "default"]}
    near = [q for q in QUEUES if nodes[q] == nodes["default"]][0]
    far = [q for q in QUEUES if nodes[q] != nodes["default"]][0]
    steps = skiplock.enqueue(url, "d.steps", {"steps": 3, "fail_at": 1}, queue=near)
    rows = skiplock.enqueue(url, "d.rows", {"steps": 3}, queue=far)
    sleeper = skiplock.enqueue(url, "d.sleep", {"seconds": 1}, queue=far)
    waiter = skiplock.enqueue(url, "d.signal", {"name": "go"}, queue=near)
    # its children go to "default", on the other node
    parent = skiplock.enqueue(url, "d.parent", {"children": 3}, queue=far)
    worker = processes.spawn(url, "--concurrency", "4", "--queues", ",".join([*QUEUES, "default"]), tasks=HANDLERS)
    processes.wait_ready(worker)

    done = [steps, rows, sleeper, waiter, parent]

    def why() -> str:  # each task's events and the worker's log, for a failure to say what happened
        return f"{[(t, _events(db, t)) for t in done]}\n{worker.log()[-3000:]}"

    try:
        wait_for(lambda: _state(db, waiter) == "waiting", 30, message="the signal waiter suspended")
        assert skiplock.send_signal(url, "go", {"x": 1}) == (True, 1)
        assert skiplock.send_signal(url, "go", {"x": 2}) == (False, 0)  # the first send wins
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'completed'",
                                (done,)) == len(done), 60, message="every durable task completed")
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n{why()}") from None

    # steps: the failure after step 1 repeats no step; three records on the task's shard
    assert _notes(db, steps) == {"s0": 1, "s1": 1, "s2": 1}
    assert scalar(db, "SELECT attempts FROM skiplock.tasks WHERE id = %s", (steps,)) == 2
    assert scalar(db, "SELECT count(*) FROM skiplock.task_steps WHERE task_id = %s AND queue = %s",
                  (steps, near)) == 3
    # step transactions: each row written once, with its record
    assert scalar(db, "SELECT count(*) FROM public.step_rows WHERE task_id = %s", (rows,)) == 3
    # the sleep: suspended, woken by its time, and each side of it run once
    assert _notes(db, sleeper) == {"before": 1, "after": 1}
    assert ("suspended", None) in _events(db, sleeper) and ("queued", "sleep ended") in _events(db, sleeper)
    # the signal: woken by the send, with the first payload
    assert scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (waiter,)) == {"got": {"x": 1}}
    assert ("queued", "signal") in _events(db, waiter)
    # the children on the other node ended, then the parent resumed once and saw them
    children = [r[0] for r in db.execute("SELECT id FROM skiplock.tasks WHERE kind = 'd.child'").fetchall()]
    assert len(children) == 3 and {_state(db, c) for c in children} == {"completed"}
    assert scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (parent,)) == \
        {"states": ["completed"] * 3, "n": 3}
    assert _notes(db, parent) == {"spawn": 1, "resumed": 1}
    assert ("queued", "parent ended") in _events(db, parent)
    assert "could not" not in worker.log(), worker.log()[-2000:]


def test_a_worker_killed_mid_run_its_successor_repeats_no_recorded_step(fresh, processes):  # noqa: F811
    url, db = fresh
    task_id = skiplock.enqueue(url, "d.steps", {"steps": 6, "step_sleep": 0.4}, queue=QUEUES[2])
    first = processes.spawn(url, "--queues", QUEUES[2], tasks=HANDLERS, env=ENV)
    processes.wait_ready(first)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.task_steps WHERE task_id = %s", (task_id,)) >= 2,
             30, interval=0.05, message="two steps recorded")
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait(10)
    recorded = scalar(db, "SELECT count(*) FROM skiplock.task_steps WHERE task_id = %s", (task_id,))
    second = processes.spawn(url, "--queues", QUEUES[2], tasks=HANDLERS, env=ENV)
    processes.wait_ready(second)
    wait_for(lambda: _state(db, task_id) == "completed", 60, message="the task completed after the kill")
    notes = _notes(db, task_id)
    assert sorted(notes) == [f"s{i}" for i in range(6)]
    # the steps recorded before the kill ran once; only the one in flight at the kill ran again
    assert all(notes[f"s{i}"] == 1 for i in range(recorded)), (recorded, notes)
    assert sum(notes.values()) - 6 <= 1, notes
    assert scalar(db, "SELECT reclaims FROM skiplock.tasks WHERE id = %s", (task_id,)) == 1
    tokens = [r[0] for r in db.execute("SELECT lease_token FROM skiplock.task_steps WHERE task_id = %s "
                                       "ORDER BY position", (task_id,)).fetchall()]
    assert tokens == sorted(tokens) and len(set(tokens)) == 2  # each run wrote under its own token

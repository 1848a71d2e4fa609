"""Durable execution in one worker (issue 33): steps recorded once and replayed, sleeps that end
the run and wake it on the database's clock, signals sent before and after the wait, children
awaited, mismatches and bad input as one-line failures. Real Postgres, the worker's own claimer,
executor, completer and waker, driven by hand so that each run is one step of the test."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

import skiplock
import skiplock.engine.errors
import tests.support.durable_handlers  # noqa: F401 - registers the d.* kinds
import tests.support.handlers  # noqa: F401
from skiplock.engine.metrics import Metrics
from skiplock.engine.registry import REGISTRY
from skiplock.engine.settings import Settings
from skiplock.engine.wake import Waker
from skiplock.worker.executor import Executor
from skiplock.worker.worker import Worker
from tests.support.harness import scalar


@pytest.fixture
def worker(db_url, store, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_DATABASE_URL", db_url)
    settings = Settings(database_url=db_url, concurrency=8, poll_seconds=0.1)
    return Worker(settings, store, registry=REGISTRY, metrics=Metrics())


def run_round(worker) -> int:
    """Claim what is claimable, run each handler on this thread, write the outcomes; returns
    how many ran."""
    claimed = worker.claimer.run_once().claimed
    executor = Executor((), 1.0)
    runs = worker.slots.held()
    for run in runs:
        outcome = executor.run(run) if not run.definition.is_async else _run_async(executor, run)
        worker.completer.accept(run, outcome)
    worker.completer.run_once()
    return claimed


def _run_async(executor, run):
    import asyncio
    return asyncio.run(executor.run_async(run))


def drive(worker, store, db, ids, timeout=15.0) -> dict:
    """Rounds (and wake-ups) until every task of `ids` is final; returns {id: state}."""
    deadline = time.monotonic() + timeout
    waker = Waker(store)
    while time.monotonic() < deadline:
        waker.run_once()
        run_round(worker)
        states = dict(db.execute("SELECT id, state FROM skiplock.tasks WHERE id = ANY(%s)", (list(ids),)).fetchall())
        if all(s in ("completed", "failed", "cancelled") for s in states.values()):
            return states
        time.sleep(0.05)
    raise AssertionError(f"not final: {states}")


def effects(db, task_id) -> list[str]:
    return [r[0] for r in db.execute("SELECT note FROM public.executions WHERE task_id = %s ORDER BY at",
                                     (task_id,)).fetchall()]


def row(db, task_id):
    return db.execute("SELECT state, attempts, result, last_error, suspended, wake_at, awaited_signal "
                      "FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()


def test_steps_are_recorded_once_and_replayed_across_a_retry(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.steps", {"steps": 3, "fail_at": 1})
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    # s0 and s1 ran on attempt 1, which then raised; attempt 2 replayed them and ran s2
    assert effects(db, task_id) == ["s0", "s1", "s2"]
    result = row(db, task_id)[2]
    assert [r["attempt"] for r in result["results"]] == [1, 1, 2]
    steps = db.execute("SELECT position, name, occurrence, type, attempt FROM skiplock.task_steps "
                       "WHERE task_id = %s ORDER BY position", (task_id,)).fetchall()
    assert steps == [(1, "s0", 1, "step", 1), (2, "s1", 1, "step", 1), (3, "s2", 1, "step", 2)]


def test_step_transactions_commit_their_rows_once(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.rows", {"steps": 5})
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert scalar(db, "SELECT count(*) FROM public.step_rows WHERE task_id = %s", (task_id,)) == 5


def test_a_sleep_ends_the_run_and_wakes_on_time(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.sleep", {"seconds": 1})
    start = time.monotonic()
    assert run_round(worker) == 1
    state, attempts, _, _, suspended, wake_at, _ = row(db, task_id)
    assert (state, attempts, suspended) == ("waiting", 0, "sleep")  # no attempt spent
    assert worker.slots.in_flight() == 0
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert time.monotonic() - start >= 0.9
    assert effects(db, task_id) == ["before", "after"]
    types = [r[0] for r in db.execute("SELECT type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                                      (task_id,)).fetchall()]
    assert types == ["queued", "running", "suspended", "queued", "running", "completed"]


def test_signals_before_and_after_the_wait(worker, store, db, db_url):
    early = skiplock.send_signal(db_url, "order-1.confirmed", {"by": "warehouse"})
    assert early == (True, 0)
    before = skiplock.enqueue(db_url, "d.signal", {"name": "order-1.confirmed"})
    after = skiplock.enqueue(db_url, "d.signal", {"name": "order-2.confirmed"})
    run_round(worker)
    assert row(db, before)[0] == "completed" and row(db, before)[2] == {"got": {"by": "warehouse"}}
    assert row(db, after)[0] == "waiting" and row(db, after)[6] == "order-2.confirmed"
    # a send in a transaction that rolls back wakes nothing
    with psycopg.connect(db_url) as conn:
        skiplock.send_signal(conn, "order-2.confirmed", {"n": 0})
        conn.rollback()
    assert row(db, after)[0] == "waiting"
    assert skiplock.send_signal(db_url, "order-2.confirmed", {"n": 1}) == (True, 1)
    assert skiplock.send_signal(db_url, "order-2.confirmed", {"n": 2}) == (False, 0)  # the first wins
    assert drive(worker, store, db, [after]) == {after: "completed"}
    assert row(db, after)[2] == {"got": {"n": 1}}


def test_a_signal_wait_times_out_with_none(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.signal", {"name": "never", "timeout": 0.5})
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert row(db, task_id)[2] == {"got": None}


def test_a_parent_awaits_its_children_and_sees_their_outcomes(worker, store, db, db_url):
    parent = skiplock.enqueue(db_url, "d.parent", {"children": 5, "fail": [2]})
    states = drive(worker, store, db, [parent])
    assert states == {parent: "completed"}
    assert row(db, parent)[2] == {"states": ["completed"] * 4 + ["failed"], "n": 5}
    assert effects(db, parent) == ["spawn", "resumed"]  # spawned once, resumed once after the last child
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 'd.child'") == 5


def test_async_handlers_await_steps_and_sleeps(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.async", {"seconds": 0.2})
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert row(db, task_id)[2] == {"b": 2}


def test_a_changed_handler_fails_with_one_line_and_keeps_its_records(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.changed", {"order": "a,b,c", "pause_after": "b"})
    run_round(worker)
    assert row(db, task_id)[0] == "waiting"
    db.execute("INSERT INTO public.executions (task_id, pid, note) VALUES (%s, 0, 'order:a,c,b')",
               (uuid.uuid4(),))
    assert drive(worker, store, db, [task_id]) == {task_id: "failed"}
    error = row(db, task_id)[3]
    assert "\n" not in error
    assert "step mismatch at position 2: this run called step 'c', the recorded call there is step 'b'" in error
    recorded = db.execute("SELECT position, name, type FROM skiplock.task_steps WHERE task_id = %s ORDER BY position",
                          (task_id,)).fetchall()
    assert recorded == [(1, "a", "step"), (2, "b", "step"), (3, "sleep", "sleep")]


@pytest.mark.parametrize("case, line", [
    ("empty name", "step name must be 1-200 characters (got 0)"),
    ("long name", "step name must be 1-200 characters (got 201)"),
    ("not json", "step 's' result is not JSON-serializable"),
    ("too large", "step 's' result is 2002 bytes; the limit is 1000 (SKIPLOCK_MAX_PAYLOAD_BYTES)"),
    ("negative sleep", "sleep -1: must be a finite number of seconds >= 0"),
    ("naive sleep_until", "must be a timezone-aware datetime"),
    ("signal name", "signal name must be 1-200 characters (got 0)"),
    ("too many", "more than 5 steps and waits in one task"),
    ("nested", "step 'inner' called inside another step"),
])
def test_bad_input_fails_the_task_with_one_line_and_keeps_nothing(worker, store, db, db_url, monkeypatch,
                                                                   case, line):
    monkeypatch.setenv("SKIPLOCK_MAX_PAYLOAD_BYTES", "1000")
    monkeypatch.setattr("skiplock.worker.durable.MAX_STEPS_PER_TASK", 5)
    task_id = skiplock.enqueue(db_url, "d.bad", {"case": case})
    assert drive(worker, store, db, [task_id]) == {task_id: "failed"}
    state, attempts, _, error, *_ = row(db, task_id)
    assert attempts == 1  # failed at once: another attempt would make the same call
    assert line in error and "\n" not in error
    recorded = scalar(db, "SELECT count(*) FROM skiplock.task_steps WHERE task_id = %s", (task_id,))
    assert recorded == (5 if case == "too many" else 0)


def test_children_of_a_step_commit_with_its_record_only(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.spawn_then_fail", {})
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    children = db.execute("SELECT id, payload FROM skiplock.tasks WHERE kind = 't.noop'").fetchall()
    assert [c[1] for c in children] == [{"from": 2}]  # the first attempt's child rolled back with its step
    assert row(db, task_id)[2] == {"child": str(children[0][0])}


def test_cancel_a_suspended_task_and_resume_it_keeps_its_steps(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.sleep", {"seconds": 0.5})
    run_round(worker)
    assert row(db, task_id)[0] == "waiting"
    assert store.tasks.task_cancel(task_id) == "cancelled"
    assert row(db, task_id)[0] == "cancelled"
    time.sleep(0.6)
    assert Waker(store).run_once() == 0  # a cancelled task is not woken
    store.tasks.task_resume(task_id)
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert effects(db, task_id) == ["before", "after"]  # "before" was not run again


def test_retention_deletes_the_steps_with_the_task(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.steps", {"steps": 2})
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert scalar(db, "SELECT count(*) FROM skiplock.task_steps WHERE task_id = %s", (task_id,)) == 2
    db.execute("UPDATE skiplock.tasks SET finished_at = now() - interval '2 days' WHERE id = %s", (task_id,))
    assert store.tasks.task_delete_finished("completed", 86400, limit=10) == 1
    assert scalar(db, "SELECT count(*) FROM skiplock.task_steps WHERE task_id = %s", (task_id,)) == 0


def test_a_signal_send_in_a_repeatable_read_transaction_is_refused(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(skiplock.engine.errors.InvalidInput, match="READ COMMITTED"):
            skiplock.send_signal(conn, "x", {})


def test_a_step_behind_the_runs_own_lock_on_its_row_fails_in_seconds_not_never(worker, store, db, db_url):
    """A child depending on the running task, enqueued outside a step, holds the task's row in the
    run's own transaction until the run ends; the step's record would wait for it forever."""
    task_id = skiplock.enqueue(db_url, "d.self_child", {})
    start = time.monotonic()
    assert drive(worker, store, db, [task_id], timeout=30) == {task_id: "failed"}
    assert time.monotonic() - start < 15
    error = row(db, task_id)[3]
    assert "stayed locked for 5 s while a step was recorded" in error and "inside the step" in error
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 't.noop'") == 0  # rolled back


def test_a_wait_for_other_tasks_than_recorded_fails_instead_of_waiting_forever(worker, store, db, db_url):
    task_id = skiplock.enqueue(db_url, "d.children_outside_a_step", {})
    assert drive(worker, store, db, [task_id]) == {task_id: "failed"}
    error = row(db, task_id)[3]
    assert "wait_for_tasks at position 1 waits for other tasks than this task recorded" in error
    # the first run's two children ran; the failed run's own two rolled back with it
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 'd.child'") == 2


def test_a_step_record_refused_after_a_heartbeat_found_the_claim_lost_is_counted(worker, store, db, db_url):
    # the zombie of tests/reliability/test_durable_faults.py: woken inside a step, its keeper's
    # heartbeat finds the claim gone first, then the step's record meets the fence
    task_id = skiplock.enqueue(db_url, "d.rows", {"steps": 2})
    assert worker.claimer.run_once().claimed == 1
    (run,) = worker.slots.held()
    db.execute("UPDATE skiplock.tasks SET lease_token = lease_token + 1 WHERE id = %s", (task_id,))
    assert worker.keeper.heartbeat_once() == 0
    assert worker.slots.in_flight() == 0  # given up: its outcome is to be dropped
    worker.completer.accept(run, Executor((), 1.0).run(run))
    rejected = worker.metrics.stale_writes_rejected
    assert (rejected.labels("heartbeat")._value.get(), rejected.labels("step_record")._value.get()) == (1, 1)
    assert scalar(db, "SELECT count(*) FROM skiplock.task_steps") == 0
    assert scalar(db, "SELECT count(*) FROM public.step_rows") == 0  # the step's row rolled back with it


def test_a_wait_that_meets_a_send_in_flight_looks_again_and_gets_it(worker, store, db, db_url):
    """The send's transaction is open (its lock held, its signal not committed) while the task
    suspends: the suspension cannot see the signal and the send cannot see the suspension, so the
    task is queued to look again in a second rather than left waiting."""
    task_id = skiplock.enqueue(db_url, "d.signal", {"name": "order-9.shipped"})
    with psycopg.connect(db_url) as sender:
        assert skiplock.send_signal(sender, "order-9.shipped", {"n": 9}) == (True, 0)
        run_round(worker)  # the handler finds no signal and suspends
        state, _, _, _, suspended, _, _ = row(db, task_id)
        assert state == "queued" and suspended is None
        due = scalar(db, "SELECT run_after - now() FROM skiplock.tasks WHERE id = %s", (task_id,))
        assert 0 < due.total_seconds() <= 1.0
    # the sender committed on leaving the block
    assert drive(worker, store, db, [task_id]) == {task_id: "completed"}
    assert row(db, task_id)[2] == {"got": {"n": 9}}

"""The worker's parts one unit of work at a time, through their run_once(): the claimer claims
into the slots, the completer writes a batch, the keeper heartbeats and times out. The worker is
built but not started, so no thread runs a handler behind the test's back."""

from __future__ import annotations

import time

import psycopg
import pytest

import skiplock
import tests.support.handlers  # noqa: F401 - registers the t.* kinds
from skiplock.engine.metrics import Metrics
from skiplock.engine.registry import REGISTRY
from skiplock.engine.settings import Settings
from skiplock.worker.executor import settlement
from skiplock.worker.worker import Worker


def make_worker(db_url, store, monkeypatch, poll_seconds: float = 0.1) -> Worker:
    monkeypatch.setenv("SKIPLOCK_DATABASE_URL", db_url)  # the t.* handlers record through it
    settings = Settings(database_url=db_url, concurrency=3, poll_seconds=poll_seconds, stuck_grace_seconds=1)
    return Worker(settings, store, registry=REGISTRY, metrics=Metrics())


@pytest.fixture
def worker(db_url, store, monkeypatch):
    return make_worker(db_url, store, monkeypatch)


def states(db) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM skiplock.tasks GROUP BY state").fetchall())


def test_the_claimer_claims_up_to_the_free_slots(worker, db_url, db):
    for _ in range(5):
        skiplock.enqueue(db_url, "t.noop", {})
    first = worker.claimer.run_once()
    assert (first.claimed, first.asked, first.full) == (3, 3, True)
    assert worker.slots.busy == 3 and worker.slots.in_flight() == 3
    assert worker.counts["claimed"] == 3
    assert states(db) == {"running": 3, "queued": 2}
    # every slot is taken: no claim is made at all
    assert worker.claimer.run_once() == (0, 0, False)
    assert states(db) == {"running": 3, "queued": 2}


def test_a_claim_turned_away_by_its_lanes_is_not_a_sign_of_empty_queues(worker, db_url, db, store):
    worker.claimer.lanes = 1
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 4)
    params = dict(queues=["default"], limit=1, owner="holder", lease_seconds=30, kind_max_attempts=None,
                  park_limit=0, lanes=1)
    with psycopg.connect(db_url) as holder:  # another claim of the queue, in flight: its one lane held
        holder.execute(store.db.sql["task_claim"], params)
        assert worker.claimer.run_once() == (0, 3, True)
        assert worker.metrics.claims_crowded._value.get() == 1
    # the lane is free again: the next claim goes ahead at once, with no notification
    assert worker.claimer.run_once() == (3, 3, False)
    assert states(db) == {"running": 4}


def test_a_claim_that_finds_the_queues_empty_waits_for_the_poll_or_a_notification(db_url, store, monkeypatch, db):
    # a poll interval that a loaded machine cannot pass between two statements of this test
    worker = make_worker(db_url, store, monkeypatch, poll_seconds=60)
    skiplock.enqueue(db_url, "t.noop", {})
    assert worker.claimer.run_once() == (1, 3, False)  # asked for all three free slots
    skiplock.enqueue(db_url, "t.noop", {})
    assert worker.claimer.run_once() == (0, 0, False)  # drained: not before the poll interval
    worker.claimer.on_notify("default")
    assert worker.claimer.run_once().claimed == 1



def test_the_claimer_waits_for_the_writer_once_a_concurrency_of_outcomes_waits(worker, db_url, db):
    """Outcomes waiting for the writer hold the claims back past `concurrency` of them: a writer
    slower than the claims (a saturated database) must not let claims in flight grow without end."""
    for _ in range(9):
        skiplock.enqueue(db_url, "t.noop", {})

    def handlers_return():
        for run in worker.slots.held():
            if not run.handler_done:
                worker.completer.accept(run, settlement(run, "completed", result=None))

    assert worker.claimer.run_once().claimed == 3
    handlers_return()
    assert worker.claimer.run_once().claimed == 3  # 3 outcomes wait: still within the bound
    handlers_return()
    assert worker.completer.pending() == 6 and worker.slots.busy == 0
    assert worker.claimer.run_once() == (0, 0, False)  # every slot free, but the writer is behind
    assert states(db) == {"running": 6, "queued": 3}
    worker.slots.wake.clear()
    assert worker.completer.run_once() == 6
    assert worker.slots.wake.is_set(), "the claimer is not woken when the writer catches up"
    assert worker.claimer.run_once().claimed == 3

def test_the_completer_writes_a_batch_in_one_run(worker, db_url, db):
    for _ in range(3):
        skiplock.enqueue(db_url, "t.noop", {})
    assert worker.claimer.run_once().claimed == 3
    runs = worker.slots.held()
    for run in runs:  # what a handler thread does when its handler returns
        worker.completer.accept(run, settlement(run, "completed", result=None))
    assert worker.slots.busy == 0 and worker.completer.pending() == 3
    assert worker.completer.run_once() == 3
    assert worker.completer.pending() == 0 and worker.slots.in_flight() == 0
    assert worker.counts["settled"] == 3 and worker.counts["rejected"] == 0
    assert states(db) == {"completed": 3}
    assert worker.completer.run_once() == 0


def test_the_completer_counts_a_write_its_fence_refused(worker, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    assert worker.claimer.run_once().claimed == 1
    db.execute("UPDATE skiplock.tasks SET lease_token = lease_token + 1 WHERE id = %s", (task_id,))
    (run,) = worker.slots.held()
    worker.completer.accept(run, settlement(run, "completed", result=None))
    assert worker.completer.run_once() == 1
    assert worker.counts["rejected"] == 1 and worker.counts["settled"] == 0
    assert worker.metrics.stale_writes_rejected.labels("completed")._value.get() == 1
    assert states(db) == {"running": 1}


def test_the_completer_writes_again_an_outcome_whose_row_another_transaction_held(worker, db_url, db):
    import psycopg

    ids = [skiplock.enqueue(db_url, "t.noop", {}) for _ in range(2)]
    assert worker.claimer.run_once().claimed == 2
    for run in worker.slots.held():
        worker.completer.accept(run, settlement(run, "completed", result=None))
    with psycopg.connect(db_url) as other:  # holds one row, as another worker's claim statement can
        other.execute("SELECT 1 FROM skiplock.tasks WHERE id = %s FOR UPDATE", (ids[0],))
        assert worker.completer.run_once() == 2  # returns at once: no wait for the row
        assert worker.completer.pending() == 1 and worker.slots.in_flight() == 1
        assert states(db) == {"completed": 1, "running": 1}
    busy = worker.metrics.outcome_writes_busy.labels("default")
    assert busy._value.get() == 1
    assert worker.completer.run_once() == 1
    assert worker.completer.pending() == 0 and worker.slots.in_flight() == 0
    assert worker.counts["settled"] == 2 and worker.counts["rejected"] == 0
    assert states(db) == {"completed": 2}
    assert busy._value.get() == 1  # counted once: the second write went through


def test_an_outcome_on_the_handlers_own_transaction_is_written_again_while_its_row_is_held(worker, db_url, db):
    import threading

    task_id = skiplock.enqueue(db_url, "t.noop", {})
    assert worker.claimer.run_once().claimed == 1
    (run,) = worker.slots.held()
    with run.ctx.transaction() as conn:  # what a handler does with ctx.transaction()
        conn.execute("SELECT 1")
    other = psycopg.connect(db_url)
    other.execute("SELECT 1 FROM skiplock.tasks WHERE id = %s FOR UPDATE", (task_id,))
    threading.Timer(0.2, other.commit).start()  # the row is let go while the writes are retried
    try:
        worker.completer.accept(run, settlement(run, "completed", result=None))
    finally:
        other.close()
    assert states(db) == {"completed": 1}
    assert worker.counts["settled"] == 1
    assert worker.metrics.outcome_writes_busy.labels("default")._value.get() >= 1


def test_the_keeper_heartbeats_every_claim_and_gives_up_lost_ones(worker, db_url, db):
    ids = [skiplock.enqueue(db_url, "t.noop", {}) for _ in range(2)]
    assert worker.claimer.run_once().claimed == 2
    db.execute("UPDATE skiplock.tasks SET lease_until = now() + interval '1 second'")
    db.execute("UPDATE skiplock.tasks SET lease_token = lease_token + 1 WHERE id = %s", (ids[0],))
    done = worker.keeper.run_once(time.monotonic() + worker.config.heartbeat_seconds)
    assert done["heartbeats"] == 1  # the other claim is held by someone else now
    assert worker.slots.busy == 1 and worker.slots.in_flight() == 1
    assert worker.counts["rejected"] == 1
    assert worker.metrics.stale_writes_rejected.labels("heartbeat")._value.get() == 1
    renewed = db.execute("SELECT lease_until > now() + interval '10 seconds' FROM skiplock.tasks WHERE id = %s",
                         (ids[1],)).fetchone()[0]
    assert renewed


def test_the_keeper_abandons_a_handler_past_its_timeout_and_the_completer_writes_the_retry(worker, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.timeout", {"sleep": 0})
    assert worker.claimer.run_once().claimed == 1
    assert worker.keeper.run_once(time.monotonic() + 0.1)["abandoned"] == 0  # within its 0.3 s
    done = worker.keeper.run_once(time.monotonic() + 0.3 + worker.config.stuck_grace_seconds + 0.1)
    assert done["abandoned"] == 1
    assert worker.slots.busy == 0 and worker.completer.pending() == 1
    assert worker.completer.run_once() == 1
    # t.timeout allows one attempt: the retry the keeper asked for fails the task
    row = db.execute("SELECT state, last_error FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
    assert row[0] == "failed" and row[1].startswith("TimeoutError: timed out after 0.3s")
    assert worker.exit_code == 0


def test_an_outcome_the_database_refuses_fails_its_task_and_the_rest_of_the_batch_is_written(worker, db_url, db):
    """One write path: a batch holding an outcome Postgres cannot store (a NUL character in a
    jsonb result) is written again one outcome at a time, the others stand, and the refused one
    fails its task with the reason."""
    ids = [skiplock.enqueue(db_url, "t.noop", {}) for _ in range(3)]
    assert worker.claimer.run_once().claimed == 3
    runs = sorted(worker.slots.held(), key=lambda run: ids.index(run.task.id))
    for i, run in enumerate(runs):
        result = {"text": "nul \x00 here"} if i == 1 else {"n": i}
        worker.completer.accept(run, settlement(run, "completed", result=result))
    assert worker.completer.run_once() == 3
    rows = dict(db.execute("SELECT id, state FROM skiplock.tasks").fetchall())
    assert [rows[i] for i in ids] == ["completed", "failed", "completed"]
    error = db.execute("SELECT last_error FROM skiplock.tasks WHERE id = %s", (ids[1],)).fetchone()[0]
    assert error.startswith("outcome not storable: "), error
    assert worker.slots.in_flight() == 0 and worker.completer.pending() == 0
    assert worker.slots.counts["settled"] == 3

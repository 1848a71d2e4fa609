"""The task lifecycle through an in-process worker: outcomes, retries, steps, fencing, events."""

from __future__ import annotations

import time

import pytest

import skiplock
import tests.support.handlers  # noqa: F401 - registers the t.* kinds
from skiplock.engine.registry import REGISTRY
from skiplock.engine.metrics import Metrics
from skiplock.engine.settings import Settings
from skiplock.worker.worker import Worker
from tests.support.harness import wait_for


@pytest.fixture
def make_worker(db_url, store, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_DATABASE_URL", db_url)  # the t.* handlers record through it
    started: list[Worker] = []

    def make(**overrides) -> Worker:
        settings = Settings(database_url=db_url, **{"concurrency": 4, "poll_seconds": 0.1, **overrides})
        worker = Worker(settings, store, registry=REGISTRY, metrics=Metrics()).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop.set()
        worker.stop.set()
        worker.shutdown()


def drain(worker: Worker, db, task_id, states=("completed", "failed", "cancelled"), timeout=20.0) -> str:
    def finished():
        worker.run_once()
        state = db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]
        return state if state in states else None

    return wait_for(finished, timeout, interval=0.02, message=f"task {task_id} to reach {states}")


def events(db, task_id) -> list[tuple[int, str]]:
    return db.execute("SELECT seq, type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                      (task_id,)).fetchall()


def executions(db, task_id) -> int:
    return db.execute("SELECT count(*) FROM public.executions WHERE task_id = %s", (task_id,)).fetchone()[0]


def task_row(db, task_id) -> dict:
    cur = db.execute("SELECT * FROM skiplock.tasks WHERE id = %s", (task_id,))
    return dict(zip([c.name for c in cur.description], cur.fetchone()))


def test_completed_with_result_and_gap_free_events(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.record", {"sleep": 0})
    assert drain(worker, db, task_id) == "completed"
    row = task_row(db, task_id)
    assert row["result"] == {"slept": 0.0}
    assert row["attempts"] == 1 and row["finished_at"] is not None and row["lease_until"] is None
    assert events(db, task_id) == [(1, "queued"), (2, "running"), (3, "completed")]
    assert row["event_seq"] == 3


def test_exception_retries_with_backoff_until_success(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.fail_until", {"ok_at": 3})
    assert drain(worker, db, task_id) == "completed"
    assert executions(db, task_id) == 3
    assert [t for _, t in events(db, task_id)] == [
        "queued", "running", "retrying", "running", "retrying", "running", "completed"]
    retry_data = db.execute("SELECT data FROM skiplock.task_events WHERE task_id = %s AND type = 'retrying'",
                            (task_id,)).fetchall()
    for (data,) in retry_data:
        assert data["error"].startswith("RuntimeError: boom on attempt")
        assert 0 <= data["delay"] <= 0.2  # the kind's cap


def test_attempts_exhausted_fail_and_keep_last_error(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.always_fails", {})
    assert drain(worker, db, task_id) == "failed"
    row = task_row(db, task_id)
    assert executions(db, task_id) == 3
    assert row["attempts"] == 3 and row["last_error"] == "ValueError: always"
    assert [t for _, t in events(db, task_id)][-1] == "failed"


def test_explicit_max_attempts_overrides_the_kind(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.always_fails", {}, max_attempts=1)
    assert drain(worker, db, task_id) == "failed"
    assert executions(db, task_id) == 1


def test_fail_is_permanent(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.fail_permanently", {})
    assert drain(worker, db, task_id) == "failed"
    assert executions(db, task_id) == 1
    assert task_row(db, task_id)["last_error"] == "bad input: no such customer"


def test_retry_with_explicit_delay(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.retry_later", {"delay": 0.5})
    wait_for(lambda: (worker.run_once(), executions(db, task_id))[1] == 1 and
             task_row(db, task_id)["state"] == "queued", 10, message="first attempt retried")
    row = task_row(db, task_id)
    gap = db.execute("SELECT extract(epoch FROM %s - now())", (row["run_after"],)).fetchone()[0]
    assert 0.2 < gap <= 0.5
    assert drain(worker, db, task_id) == "completed"
    assert task_row(db, task_id)["result"] == "second time lucky"


def test_steps_checkpoint_the_cursor_and_reset_attempts(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.steps", {"n": 4})
    assert drain(worker, db, task_id) == "completed"
    cursors = [n for (n,) in db.execute("SELECT note FROM public.executions WHERE task_id = %s ORDER BY at",
                                        (task_id,))]
    assert cursors == ["None", "1", "2", "3"]
    row = task_row(db, task_id)
    assert row["result"] == {"steps": 4} and row["cursor"] == 3 and row["attempts"] == 1
    assert [t for _, t in events(db, task_id)].count("checkpoint") == 3


def test_unknown_kind_fails_with_a_clear_error(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "nobody.knows", {})
    assert drain(worker, db, task_id) == "failed"
    row = task_row(db, task_id)
    assert "no handler for task kind 'nobody.knows'" in row["last_error"]
    assert row["attempts"] == 1


def test_unserializable_result_fails(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.unserializable", {})
    assert drain(worker, db, task_id) == "failed"
    assert "not JSON-serializable" in task_row(db, task_id)["last_error"]


def test_async_handler(make_worker, db_url, db):
    worker = make_worker()
    ids = skiplock.enqueue_many(db_url, "t.async", [{"sleep": 0.05}] * 8)
    for task_id in ids:
        assert drain(worker, db, task_id) == "completed"
    assert task_row(db, ids[0])["result"] == {"async": True, "attempt": 1}


def test_transactional_completion_commits_business_rows_with_the_outcome(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.transactional", {"amount": 100})
    assert drain(worker, db, task_id) == "completed"
    assert db.execute("SELECT count(*), sum(amount) FROM public.ledger").fetchone() == (1, 100)


def test_transactional_completion_whose_fence_fails_rolls_back(make_worker, db_url, db):
    worker = make_worker()
    task_id = skiplock.enqueue(db_url, "t.transactional", {"amount": 100, "sleep": 1.0})
    wait_for(lambda: (worker.run_once(), executions(db, task_id))[1] == 1, 10, message="handler started")
    # another claimer takes the task over while the handler is inside its transaction
    db.execute("UPDATE skiplock.tasks SET lease_token = nextval('skiplock.lease_tokens') WHERE id = %s",
               (task_id,))
    wait_for(lambda: worker.counts["rejected"] == 1, 10, message="the stale completion refused")
    assert db.execute("SELECT count(*) FROM public.ledger").fetchone()[0] == 0
    assert task_row(db, task_id)["state"] == "running"  # untouched: it belongs to the new holder
    stale = worker.metrics.stale_writes_rejected.labels("completed")._value.get()
    assert stale == 1


def test_cancel_a_running_task_reaches_the_handler_through_the_heartbeat(make_worker, db_url, db, store):
    worker = make_worker(lease_seconds=3, heartbeat_seconds=0.2, shutdown_grace_seconds=1)
    task_id = skiplock.enqueue(db_url, "t.cancellable", {"sleep": 20})
    wait_for(lambda: (worker.run_once(), executions(db, task_id))[1] == 1, 10, message="handler started")
    assert store.tasks.task_cancel(task_id) == "cancelling"
    assert drain(worker, db, task_id, timeout=10) == "cancelled"
    assert [t for _, t in events(db, task_id)][-2:] == ["cancelling", "cancelled"]


def test_cancel_a_queued_task_and_resume_it(make_worker, db_url, db, store):
    task_id = skiplock.enqueue(db_url, "t.record", {}, delay=3600)
    assert store.tasks.task_cancel(task_id) == "cancelled"
    assert store.tasks.task_resume(task_id) == "queued"
    assert task_row(db, task_id)["run_after"] <= db.execute("SELECT now()").fetchone()[0]
    worker = make_worker()
    assert drain(worker, db, task_id) == "completed"
    with pytest.raises(skiplock.engine.errors.TaskNotResumable):
        store.tasks.task_resume(task_id)


def test_timeout_abandons_a_handler_that_ignores_it(make_worker, db_url, db):
    worker = make_worker(stuck_grace_seconds=0.3)
    task_id = skiplock.enqueue(db_url, "t.timeout", {"sleep": 3})
    assert drain(worker, db, task_id, timeout=10) == "failed"  # max_attempts=1
    row = task_row(db, task_id)
    assert row["last_error"] == "TimeoutError: timed out after 0.3s"
    assert executions(db, task_id) == 1


def test_timeout_asks_a_cooperative_handler_to_stop(make_worker, db_url, db):
    worker = make_worker(stuck_grace_seconds=30)
    task_id = skiplock.enqueue(db_url, "t.timeout", {"sleep": 10, "cooperative": True})
    started = time.monotonic()
    assert drain(worker, db, task_id, timeout=10) == "failed"
    assert time.monotonic() - started < 5
    assert task_row(db, task_id)["last_error"] == "TimeoutError: stopped at the timeout"


def test_outcomes_postgres_cannot_store_do_not_block_the_worker(make_worker, db_url, db):
    worker = make_worker()
    bad_result = skiplock.enqueue(db_url, "t.nul", {})
    bad_error = skiplock.enqueue(db_url, "t.nul", {"raise": True}, max_attempts=1)
    fine = skiplock.enqueue(db_url, "t.record", {})
    assert drain(worker, db, bad_result) == "failed"
    assert "NUL character" in task_row(db, bad_result)["last_error"]
    assert drain(worker, db, bad_error) == "failed"
    assert task_row(db, bad_error)["last_error"] == "RuntimeError: bad\\0byte"
    assert drain(worker, db, fine) == "completed"

"""Large fan-out from a handler (issue 37): a run enqueues at most SKIPLOCK_MAX_CHILDREN_PER_RUN
children, which commit with its outcome; one more fails the task at once with a one-line error
naming the setting, keeps none of them, and the worker's other outcomes are written as usual.
Enqueueing many children of one parent in one transaction writes the parent's row once. Real
Postgres, the worker's own claimer, executor and completer."""

from __future__ import annotations

import psycopg
import pytest

import skiplock
import tests.support.handlers  # noqa: F401 - registers the t.* kinds
from skiplock.engine.errors import ConfigError
from skiplock.engine.metrics import Metrics
from skiplock.engine.registry import REGISTRY
from skiplock.engine.settings import Settings
from skiplock.worker.executor import Executor
from skiplock.worker.worker import Worker
from tests.support.harness import scalar

BOUND = 200


@pytest.fixture
def worker(db_url, store, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_DATABASE_URL", db_url)  # the t.* handlers record through it
    settings = Settings(database_url=db_url, concurrency=4, poll_seconds=0.1, max_children_per_run=BOUND)
    return Worker(settings, store, registry=REGISTRY, metrics=Metrics())


def run_all(worker) -> dict:
    """Claim what is queued, run each handler as a handler thread would, then write the queued
    outcomes; returns {task id: state}."""
    assert worker.claimer.run_once().claimed > 0
    executor = Executor((), 1.0)
    runs = worker.slots.held()
    for run in runs:
        worker.completer.accept(run, executor.run(run))
    worker.completer.run_once()
    return {run.task.id: run.task.kind for run in runs}


def states(db, kind: str) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM skiplock.tasks WHERE kind = %s GROUP BY state",
                           (kind,)).fetchall())


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_run_past_the_bound_fails_at_once_and_keeps_no_child(worker, db_url, db, many):
    over = skiplock.enqueue(db_url, "t.fan", {"n": BOUND + 1, "many": many}, max_attempts=3)
    others = [skiplock.enqueue(db_url, "t.noop", {}) for _ in range(2)]
    assert set(run_all(worker)) == {over, *others}
    row = db.execute("SELECT state, attempts, last_error FROM skiplock.tasks WHERE id = %s", (over,)).fetchone()
    assert row[:2] == ("failed", 1)  # failed for good: another attempt would ask for as many
    assert "SKIPLOCK_MAX_CHILDREN_PER_RUN" in row[2] and f"at most {BOUND} per run" in row[2]
    assert "\n" not in row[2]
    assert scalar(db, "SELECT count(*) FROM skiplock.task_dependencies") == 0
    # the other outcomes of the same claim were written; no child of the failed run exists
    assert states(db, "t.noop") == {"completed": 2}


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_run_at_the_bound_completes_and_releases_its_children(worker, db_url, db, many):
    parent = skiplock.enqueue(db_url, "t.fan", {"n": BOUND, "many": many})
    other = skiplock.enqueue(db_url, "t.noop", {})
    assert set(run_all(worker)) == {parent, other}
    assert scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (parent,)) == "completed"
    assert states(db, "t.noop") == {"completed": 1, "queued": BOUND}
    assert scalar(db, "SELECT count(*) FROM skiplock.task_dependencies WHERE parent_id = %s", (parent,)) == BOUND


def test_children_of_one_parent_in_one_transaction_write_the_parent_once(db_url):
    parent = skiplock.enqueue(db_url, "t.noop", {})
    with psycopg.connect(db_url) as conn:
        for i in range(500):
            skiplock.enqueue(conn, "t.noop", {"child": i}, depends_on=[parent])
        # this transaction's own counts: one update of the parent (watched), none per child
        updated = scalar(conn, "SELECT n_tup_upd FROM pg_stat_xact_user_tables "
                               "WHERE schemaname = 'skiplock' AND relname = 'tasks'")
    assert updated == 1


def test_the_bound_is_a_positive_number():
    with pytest.raises(ConfigError, match=r"^SKIPLOCK_MAX_CHILDREN_PER_RUN=0: must be >= 1$"):
        Settings.from_env({"SKIPLOCK_MAX_CHILDREN_PER_RUN": "0"})
    assert Settings.from_env({}).max_children_per_run == 10_000

"""The scheduler's maintenance services, `run_once()` against crafted rows (and, for the
suspended tasks' gauge, rows a real worker's runs wrote)."""

from __future__ import annotations

import time

import skiplock
from skiplock.engine.metrics import Metrics
from skiplock.engine.store import Store
from skiplock.engine.reclaim import Reclaimer
from skiplock.scheduler.maintenance import QueueGauges, Retention
from tests.integration.test_durable import worker  # noqa: F401 (fixture)
from tests.support.harness import metric
from tests.support.suspended import rounds_until, suspend_one_of_each


def _set(db, task_id, sql: str) -> None:
    db.execute(f"UPDATE skiplock.tasks SET {sql} WHERE id = %s", (task_id,))


def test_reclaim_requeues_fails_and_cancels_expired_claims(store: Store, db_url, db):
    ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * 4)
    store.tasks.task_claim(["default"], 4, "gone-worker", 30)
    expired, exhausted, cancelling, healthy = ids
    _set(db, expired, "lease_until = now() - interval '1 second'")
    _set(db, exhausted, "lease_until = now() - interval '1 second', reclaims = 10")
    _set(db, cancelling, "lease_until = now() - interval '1 second', state = 'cancelling'")
    metrics = Metrics()
    assert Reclaimer(store, metrics, max_reclaims=10).run_once() == {"queued": 1, "failed": 1, "cancelled": 1}
    states = dict(db.execute("SELECT id, state FROM skiplock.tasks").fetchall())
    assert states == {expired: "queued", exhausted: "failed", cancelling: "cancelled", healthy: "running"}
    assert metric(dict(_samples(metrics)), "skiplock_task_reclaims_total", queue="default") == 2
    assert Reclaimer(store, metrics, max_reclaims=10).run_once() == {}  # nothing left to do


def test_a_task_the_reclaim_fails_logs_one_line(store: Store, db_url, db, caplog):
    exhausted, requeued = skiplock.enqueue_many(db_url, "t.noop", [{}] * 2, queue="q1")
    store.tasks.task_claim(["q1"], 2, "gone-worker", 30)
    _set(db, exhausted, "lease_until = now() - interval '1 second', reclaims = 3")
    _set(db, requeued, "lease_until = now() - interval '1 second'")
    with caplog.at_level("INFO", logger="skiplock.maintenance"):
        assert Reclaimer(store, Metrics(), max_reclaims=3).run_once() == {"queued": 1, "failed": 1}
    failed = [r for r in caplog.records if r.getMessage() == "task failed"]
    assert [(r.levelname, r.task_id, r.kind, r.queue, r.attempts, r.error) for r in failed] == [
        ("ERROR", str(exhausted), "t.noop", "q1", 1, "lease of gone-worker expired (reclaim 4)")]


def _samples(metrics: Metrics):
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            yield (f"{s.name}{{{labels}}}" if labels else s.name), s.value


def test_retention_deletes_old_finished_tasks_and_their_events_in_batches(store: Store, db_url, db):
    ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * 1205)
    old_done, recent_done, old_failed, old_cancelled, active = ids[:1200], ids[1200], ids[1201], ids[1202], ids[1203:]
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() - interval '2 days' "
               "WHERE id = ANY(%s)", (old_done,))
    _set(db, recent_done, "state = 'completed', finished_at = now() - interval '1 hour'")
    _set(db, old_failed, "state = 'failed', finished_at = now() - interval '2 days'")
    _set(db, old_cancelled, "state = 'cancelled', finished_at = now() - interval '8 days'")
    metrics = Metrics()
    retention = Retention(store, metrics, {"completed": 86400, "failed": 7 * 86400, "cancelled": 7 * 86400})
    assert retention.run_once() == {"completed": 1200, "cancelled": 1}
    left = set(r[0] for r in db.execute("SELECT id FROM skiplock.tasks").fetchall())
    assert left == {recent_done, old_failed, *active}
    orphans = db.execute("SELECT count(*) FROM skiplock.task_events e WHERE NOT EXISTS "
                         "(SELECT 1 FROM skiplock.tasks t WHERE t.id = e.task_id)").fetchone()[0]
    assert orphans == 0
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == len(left)
    assert metric(dict(_samples(metrics)), "skiplock_tasks_deleted_total", state="completed") == 1200
    # a retention of 0 keeps that state forever
    assert Retention(store, metrics, {"completed": 0, "failed": 0, "cancelled": 0}).run_once() == {}
    assert Retention(store, metrics, {"completed": 60}).run_once() == {"completed": 1}



def test_retention_past_its_time_budget_says_it_is_behind_and_the_scheduler_runs_it_again(
        store: Store, db_url, db, monkeypatch):
    """A run stops at its time budget (here: after one round of batches) and says so; the
    scheduler then runs it again on its next turn, not a retention interval later, until caught up.
    A fixed number of batches per interval capped the rate a queue could sustain (the soak)."""
    from skiplock.engine.settings import Settings
    from skiplock.scheduler import maintenance
    from skiplock.scheduler.scheduler import Scheduler

    monkeypatch.setattr(maintenance, "RUN_SECONDS", 0.0)
    total = 2 * maintenance.BATCH + 10
    ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * total)
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() - interval '2 days' "
               "WHERE id = ANY(%s)", (ids,))
    scheduler = Scheduler(Settings(retention_seconds=3600), store)
    retention = scheduler.retention
    scheduler._next_run = {name: float("inf") for name in scheduler._next_run}
    scheduler._next_run["retention"] = 0.0
    runs = []
    while True:
        scheduler.run_once()
        runs.append(db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0])
        if not retention.behind:
            break
        assert scheduler._next_run["retention"] <= time.monotonic(), "not due again at once"
    assert runs == [total - maintenance.BATCH, total - 2 * maintenance.BATCH, 0]
    # caught up: the next run is an interval away
    assert scheduler._next_run["retention"] > time.monotonic() + 3000
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 0

def test_gauges_count_only_what_is_claimable_now(store: Store, db_url, db):
    now_ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * 3, queue="main")
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 5, queue="main", delay=3600)  # waiting (backoff-like)
    paused_kind = skiplock.enqueue_many(db_url, "t.other", [{}] * 2, queue="main")
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 4, queue="paused")
    db.execute("UPDATE skiplock.tasks SET run_after = now() - interval '2 minutes' WHERE id = ANY(%s)",
               (now_ids,))
    db.execute("UPDATE skiplock.tasks SET run_after = now() - interval '1 hour' WHERE id = ANY(%s) "
               "OR queue = 'paused'", (paused_kind,))
    store.tasks.pause_set("kind", "t.other")
    store.tasks.pause_set("queue", "paused")
    running = skiplock.enqueue(db_url, "t.noop", {}, queue="work")
    store.tasks.task_claim(["work"], 1, "w", 30)
    metrics = Metrics()
    gauges = QueueGauges(store, metrics)
    gauges.run_once()
    samples = dict(_samples(metrics))
    # main: 3 claimable (2 min old); 5 wait for run_after; 2 are of a paused kind (1 h old, ignored)
    assert metric(samples, "skiplock_queue_claimable_tasks", queue="main") == 3
    age = metric(samples, "skiplock_queue_oldest_pending_age_seconds", queue="main")
    assert 120 <= age < 180
    assert metric(samples, "skiplock_queue_tasks", queue="main", state="queued") == 10
    # a paused queue has nothing claimable, however old
    assert metric(samples, "skiplock_queue_claimable_tasks", queue="paused") == 0
    assert metric(samples, "skiplock_queue_oldest_pending_age_seconds", queue="paused") == 0
    assert metric(samples, "skiplock_queue_tasks", queue="paused", state="queued") == 4
    assert metric(samples, "skiplock_queue_tasks", queue="work", state="running") == 1
    # once the work queue's task finishes and main drains, the gauges fall to 0 (not stale)
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() WHERE id = %s", (running,))
    db.execute("DELETE FROM skiplock.tasks WHERE queue = 'main'")
    store.tasks.pause_clear("kind", "t.other")
    gauges.run_once()
    samples = dict(_samples(metrics))
    assert metric(samples, "skiplock_queue_claimable_tasks", queue="main") == 0
    assert metric(samples, "skiplock_queue_oldest_pending_age_seconds", queue="main") == 0
    assert metric(samples, "skiplock_queue_tasks", queue="work", state="running") == 0
    assert metric(samples, "skiplock_queue_tasks", queue="work", state="completed") == 1


def test_suspended_tasks_are_counted_by_reason_and_as_waiting(store: Store, db_url, db, worker):
    ids = suspend_one_of_each(worker, db_url, db)  # one of each reason, and a dependent of depends_on
    second = skiplock.enqueue(db_url, "d.signal", {"name": "order-1.confirmed"})
    children = [row[0] for row in db.execute("SELECT id FROM skiplock.tasks WHERE kind = 'd.child' "
                                              "AND waiting_on = 0").fetchall()]
    # a second waiter of the signal; the children of the "tasks" one complete, which queues it
    rounds_until(worker, db, [second], ("waiting",))
    rounds_until(worker, db, children, ("completed",))
    metrics = Metrics()
    gauges = QueueGauges(store, metrics)
    assert gauges.run_once()["default"]["suspended"] == {"sleep": 1, "signal": 2}
    samples = dict(_samples(metrics))
    assert {reason: metric(samples, "skiplock_queue_suspended_tasks", queue="default", reason=reason)
            for reason in ("sleep", "signal", "tasks")} == {"sleep": 1, "signal": 2, "tasks": 0}
    # suspended or not, a waiting task is counted waiting: 3 suspended, the dependent of depends_on
    assert metric(samples, "skiplock_queue_tasks", queue="default", state="waiting") == 4
    # one send wakes both waiters
    skiplock.send_signal(db_url, "order-1.confirmed", {})
    gauges.run_once()
    samples = dict(_samples(metrics))
    assert metric(samples, "skiplock_queue_suspended_tasks", queue="default", reason="signal") == 0
    assert metric(samples, "skiplock_queue_suspended_tasks", queue="default", reason="sleep") == 1
    assert metric(samples, "skiplock_queue_tasks", queue="default", state="waiting") == 2
    assert ids["sleep"] in {str(r[0]) for r in db.execute("SELECT id FROM skiplock.tasks WHERE state = 'waiting'")}

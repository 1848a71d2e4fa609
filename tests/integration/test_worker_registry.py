"""The worker registry's statements and the maintenance services that read them, `run_once()`
against rows the store writes: a re-registration renews a row, a stale row goes after three of its
own leases and no sooner, and the gauges count workers and concurrency per queue."""

from __future__ import annotations

from skiplock.engine.metrics import Metrics
from skiplock.engine.store import Store, WorkerRecord
from skiplock.scheduler.maintenance import StaleWorkers, WorkerGauges
from tests.integration.test_maintenance import _samples
from tests.support.harness import metric


def _worker(worker_id: str, queues: list[str], concurrency: int, lease_seconds: float = 30.0) -> WorkerRecord:
    return WorkerRecord(id=worker_id, host="node-1", pid=100, queues=queues, concurrency=concurrency,
                        in_flight=0, version="1.2.3", lease_seconds=lease_seconds)


def _age(db, worker_id: str, seconds: float) -> None:
    db.execute("UPDATE skiplock.workers SET heartbeat_at = now() - %s * interval '1 second' WHERE id = %s",
               (seconds, worker_id))


def test_register_renews_and_delete_removes(store: Store, db):
    assert store.workers.worker_register(_worker("a", ["default"], 4)) is True
    _age(db, "a", 20)
    assert store.workers.worker_register(_worker("a", ["default"], 4)._replace(in_flight=3)) is False  # a renewal
    (row,) = store.workers.worker_list()
    assert (row.id, row.queues, row.concurrency, row.in_flight, row.version) == ("a", ["default"], 4, 3, "1.2.3")
    assert row.heartbeat_age_seconds < 5 and row.started_at <= row.heartbeat_at
    assert store.workers.worker_delete("a") is True
    assert store.workers.worker_delete("a") is False  # already gone
    assert store.workers.worker_list() == []


def test_stale_rows_go_after_three_of_their_own_leases(store: Store, db):
    store.workers.worker_register(_worker("short-dead", ["default"], 2, lease_seconds=10))
    store.workers.worker_register(_worker("short-alive", ["default"], 2, lease_seconds=10))
    store.workers.worker_register(_worker("long", ["default"], 2, lease_seconds=60))
    _age(db, "short-dead", 31)
    _age(db, "short-alive", 29)
    _age(db, "long", 100)  # under 3 x 60
    metrics = Metrics()
    assert StaleWorkers(store, metrics).run_once() == 1
    assert sorted(w.id for w in store.workers.worker_list()) == ["long", "short-alive"]
    assert StaleWorkers(store, metrics).run_once() == 0
    assert metric(dict(_samples(metrics)), "skiplock_workers_removed_total") == 1


def test_gauges_count_workers_and_concurrency_per_queue(store: Store):
    store.workers.worker_register(_worker("a", ["default", "reports"], 4))
    store.workers.worker_register(_worker("b", ["reports"], 2))
    metrics = Metrics()
    gauges = WorkerGauges(store, metrics)
    assert gauges.run_once() == {"default": (1, 4), "reports": (2, 6)}
    samples = dict(_samples(metrics))
    assert metric(samples, "skiplock_workers", queue="reports") == 2
    assert metric(samples, "skiplock_workers_concurrency", queue="reports") == 6
    store.workers.worker_delete("a")
    assert gauges.run_once() == {"reports": (1, 2)}
    samples = dict(_samples(metrics))
    # a queue whose last worker left reads 0, not its last value
    assert metric(samples, "skiplock_workers", queue="default") == 0
    assert metric(samples, "skiplock_workers_concurrency", queue="default") == 0

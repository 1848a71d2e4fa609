"""Audit rows are kept for SKIPLOCK_RETAIN_AUDIT_SECONDS and then deleted by the scheduler's
retention, in batches; 0 keeps them."""

from __future__ import annotations

from skiplock.engine.metrics import Metrics
from skiplock.engine.settings import Settings
from skiplock.engine.store import Store
from skiplock.scheduler.maintenance import BATCH, Retention


def _audit_rows(db, n: int, age: str) -> None:
    db.execute("INSERT INTO skiplock.audit_log (at, actor, action, outcome) "
               "SELECT now() - %s::interval, 'admin-bot', 'queue.pause', 'ok' FROM generate_series(1, %s)",
               (age, n))


def test_retention_deletes_audit_rows_past_their_retention_in_batches(store: Store, db):
    _audit_rows(db, BATCH * 2 + 7, "91 days")
    _audit_rows(db, 3, "89 days")
    _audit_rows(db, 2, "0 days")
    retention = Retention(store, Metrics(), {}, Settings().retain_audit_seconds)
    assert retention.run_once() == {"audit": BATCH * 2 + 7}
    ages = db.execute("SELECT count(*) FILTER (WHERE at < now() - interval '90 days'), count(*) "
                      "FROM skiplock.audit_log").fetchone()
    assert ages == (0, 5)
    assert retention.run_once() == {}


def test_an_audit_retention_of_zero_keeps_every_row(store: Store, db):
    _audit_rows(db, 4, "10 years")
    assert Retention(store, Metrics(), {}, 0).run_once() == {}
    assert Retention(store, Metrics(), {}).run_once() == {}
    assert db.execute("SELECT count(*) FROM skiplock.audit_log").fetchone()[0] == 4


def test_the_default_is_ninety_days_and_the_variable_sets_it():
    assert Settings.from_env({}).retain_audit_seconds == 90 * 86400
    assert Settings.from_env({"SKIPLOCK_RETAIN_AUDIT_SECONDS": "3600"}).retain_audit_seconds == 3600


def test_the_scheduler_runs_audit_retention(store: Store, db):
    from skiplock.scheduler.scheduler import Scheduler

    _audit_rows(db, 3, "2 hours")
    scheduler = Scheduler(Settings(retain_audit_seconds=3600), store)
    (retention,) = [service for name, service, _ in scheduler.services if name == "retention"]
    assert retention() == {"audit": 3}

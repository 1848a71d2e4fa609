"""SKIPLOCK_DB_SCHEMA: everything, triggers included, lives in and speaks for the schema it was
migrated into; another schema in the same database is untouched."""

from __future__ import annotations

from pathlib import Path

import psycopg

import skiplock
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store


def test_a_renamed_schema_enqueues_wakes_claims_and_settles_on_its_own(db_url, db):
    applied = skiplock.migrate(db_url, schema="jobs")
    assert applied == sorted(p.name for p in (Path(__file__).parents[2] / "migrations").glob("*.sql"))
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN skiplock_jobs")
        listener.execute("LISTEN skiplock_skiplock")
        one = skiplock.enqueue(db_url, "t.noop", {"one": True}, queue="a", schema="jobs")
        many = skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(100)], queue="b", schema="jobs")
        notes = sorted((n.channel, n.payload) for n in listener.notifies(timeout=0.5))
    assert notes == [("skiplock_jobs", "a"), ("skiplock_jobs", "b")]
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0
    assert db.execute("SELECT type, count(*) FROM jobs.task_events GROUP BY 1").fetchall() == [("queued", 101)]

    store = Store.pooled(db_url, "jobs", worker_connections=True).open(wait=True)
    try:
        claimed = store.tasks.task_claim(["a", "b"], 200, "w", 30)
        assert len(claimed) == 101 and {t.id for t in claimed} == {one, *many}
        applied = store.tasks.task_settle([Settlement(t.id, t.lease_token, "completed") for t in claimed])
        assert set(applied.values()) == {"completed"} and len(applied) == 101
    finally:
        store.close()
    assert db.execute("SELECT string_agg(type, ',' ORDER BY seq) FROM jobs.task_events WHERE task_id = %s",
                      (one,)).fetchone()[0] == "queued,running,completed"

"""Bulk task actions through the real API app against real Postgres: POST /v1/tasks:retry,
:cancel and :purge change exactly the tasks of their filter in the states each acts on, in
batches, leave one audit row with the count, write each task's event, and change nothing on a
repeat; roles and bad filters answer as the other routes do."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from skiplock.engine.errors import TaskNotResumable
from skiplock.engine.model import TaskSpec
from skiplock.engine.task_actions import TaskFilter, bulk
from tests.integration.test_api import api, audit_rows, count, error_of, make_api  # noqa: F401 (fixtures)


def seed(db, state: str, n: int, *, queue: str = "default", kind: str = "k") -> list[uuid.UUID]:
    """n tasks in `state`; the insert trigger writes each one's `queued` event."""
    finished = "now()" if state in ("completed", "failed", "cancelled") else "NULL"
    ids = [r[0] for r in db.execute(
        f"INSERT INTO skiplock.tasks (id, kind, queue, state, attempts, finished_at, event_seq) "
        f"SELECT skiplock.uuid7(), %s, %s, %s, 3, {finished}, 1 FROM generate_series(1, %s) RETURNING id",
        (kind, queue, state, n)).fetchall()]
    assert count(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = ANY(%s)", (ids,)) == n
    return ids


def states(db, ids) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM skiplock.tasks WHERE id = ANY(%s) GROUP BY state",
                           (list(ids),)).fetchall())


def test_bulk_retry_changes_exactly_the_failed_and_cancelled_of_its_filter(api, db):
    failed = seed(db, "failed", 7)
    cancelled = seed(db, "cancelled", 2)
    completed = seed(db, "completed", 4)
    other_queue = seed(db, "failed", 3, queue="other")

    r = api.post("/v1/tasks:retry", json={"queue": "default", "reason": "fixed the bug"})
    assert (r.status_code, r.get_json()) == (200, {"changed": 9, "limit": 1000})
    assert states(db, failed + cancelled) == {"queued": 9}
    assert states(db, completed) == {"completed": 4} and states(db, other_queue) == {"failed": 3}
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND attempts = 0",
                 (failed + cancelled,)) == 9
    events = db.execute("SELECT type, seq, data FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                        (failed[0],)).fetchall()
    assert events[-1] == ("resumed", 2, {"by": "admin-bot", "reason": "fixed the bug"})

    again = api.post("/v1/tasks:retry", json={"queue": "default"})
    assert again.get_json() == {"changed": 0, "limit": 1000}
    rows = db.execute("SELECT actor, action, target, outcome, detail FROM skiplock.audit_log ORDER BY id").fetchall()
    assert [r[:4] for r in rows] == [("admin-bot", "task.retry_many", None, "ok")] * 2
    assert rows[0][4] == {"changed": 9, "limit": 1000, "filter": {"queue": "default"}, "reason": "fixed the bug"}
    assert rows[1][4]["changed"] == 0


def test_bulk_cancel_goes_through_cancelling_for_running_tasks_and_honours_the_limit(api, db):
    queued = seed(db, "queued", 5, kind="report")
    running = seed(db, "running", 2, kind="report")
    seed(db, "queued", 4, kind="other")

    r = api.post("/v1/tasks:cancel", json={"kind": "report", "limit": 3})
    assert r.get_json() == {"changed": 3, "limit": 3}
    r = api.post("/v1/tasks:cancel", json={"kind": "report"})
    assert r.get_json() == {"changed": 4, "limit": 1000}
    assert states(db, queued) == {"cancelled": 5} and states(db, running) == {"cancelling": 2}
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 'other' AND state = 'queued'") == 4
    assert count(db, "SELECT count(*) FROM skiplock.task_events WHERE type IN ('cancelled', 'cancelling')") == 7
    assert api.post("/v1/tasks:cancel", json={"kind": "report"}).get_json()["changed"] == 0


def test_bulk_purge_deletes_only_finished_tasks_with_their_events(api, db):
    completed = seed(db, "completed", 6)
    queued = seed(db, "queued", 2)
    r = api.post("/v1/tasks:purge", json={"ids": [str(i) for i in completed + queued]})
    assert r.get_json() == {"changed": 6, "limit": 1000}
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 2
    assert count(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = ANY(%s)", (completed,)) == 0
    assert [r[1:] for r in audit_rows(db)] == [("task.purge_many", None, "ok")]


def test_bulk_roles_and_bad_filters(api, db):
    seed(db, "failed", 2)
    for route in ("retry", "cancel", "purge"):
        assert error_of(api.post(f"/v1/tasks:{route}", json={"state": "failed"}, role="reader"))[:2] == \
            (403, "auth.forbidden")
        assert error_of(api.post(f"/v1/tasks:{route}", json={"state": "failed"}, role="submitter"))[:2] == \
            (403, "auth.forbidden")
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'failed'") == 2

    cases = [({}, "needs a filter"), ({"state": "completed"}, "retry acts on failed or cancelled"),
             ({"state": "failed", "limit": 0}, "limit"), ({"state": "failed", "limit": 10001}, "limit"),
             ({"queue": "default", "created_after": "yesterday"}, "created_after"),
             ({"ids": ["not-a-uuid"]}, "ids[0]"), ({"ids": []}, "ids"), ({"colour": "red"}, "colour")]
    for body, words in cases:
        status, code, message = error_of(api.post("/v1/tasks:retry", json=body))
        assert (status, code) == (400, "request.invalid"), (body, message)
        assert words in message and "\n" not in message, (body, message)
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'failed'") == 2
    refused = audit_rows(db)
    assert len(refused) == len(cases) and {r[1] for r in refused} == {"task.retry_many"}


def test_batches_commit_separately_and_one_audit_row_counts_them_all(store, db):
    failed = seed(db, "failed", 23)
    changed = bulk(store, "retry", TaskFilter(state="failed"), actor="ops", limit=20, batch_size=5)
    assert changed == 20
    assert states(db, failed) == {"queued": 20, "failed": 3}
    assert db.execute("SELECT actor, action, detail->>'changed' FROM skiplock.audit_log").fetchall() == [
        ("ops", "task.retry_many", "20")]
    # oldest first; the single-task resume shares the statement's body: a retried task is not resumable again
    oldest = sorted(failed)
    assert states(db, oldest[:20]) == {"queued": 20}
    with pytest.raises(TaskNotResumable):
        store.tasks.task_resume(oldest[0])
    assert store.tasks.task_resume(oldest[20]) == "queued"
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'queued'") == 21


def test_listing_by_id_and_idempotency_key(api, store):
    [keyed, other] = store.tasks.task_insert([TaskSpec("k", {}, idempotency_key="order-7"), TaskSpec("k", {})])
    assert [t["id"] for t in api.get("/v1/tasks?idempotency_key=order-7").get_json()["tasks"]] == [str(keyed)]
    assert [t["id"] for t in api.get(f"/v1/tasks?id={other}").get_json()["tasks"]] == [str(other)]


def test_rows_locked_elsewhere_are_skipped_and_left_for_a_repeat(api, db, db_url):
    failed = seed(db, "failed", 4)
    with psycopg.connect(db_url) as other:  # a transaction holding one row, as a settling worker would
        other.execute("SELECT 1 FROM skiplock.tasks WHERE id = %s FOR UPDATE", (failed[0],))
        assert api.post("/v1/tasks:retry", json={"state": "failed"}).get_json()["changed"] == 3
        assert states(db, failed[:1]) == {"failed": 1}
    assert api.post("/v1/tasks:retry", json={"state": "failed"}).get_json()["changed"] == 1
    assert states(db, failed) == {"queued": 4}

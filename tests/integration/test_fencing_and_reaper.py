"""Fenced writes and the reaper, statement by statement."""

from __future__ import annotations

import time

import skiplock
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store


def _expire(db, task_id) -> None:
    db.execute("UPDATE skiplock.tasks SET lease_until = now() - interval '1 second' WHERE id = %s", (task_id,))


def test_stale_token_cannot_complete_heartbeat_or_release(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (task,) = store.tasks.task_claim(["default"], 1, "a", 30)
    stale = task.lease_token - 1
    assert store.tasks.task_heartbeat([(task_id, stale)], 30) == {}
    for outcome in ("completed", "failed", "retry", "step", "released"):
        assert store.tasks.task_settle([Settlement(task_id, stale, outcome, delay=0)]) == {}
    assert db.execute("SELECT state, event_seq FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone() == \
        ("running", 2)
    assert store.tasks.task_heartbeat([(task_id, task.lease_token)], 30) == {task_id: "running"}
    assert store.tasks.task_settle([Settlement(task_id, task.lease_token, "completed", result={"ok": 1})]) == \
        {task_id: "completed"}
    # once finished, even the right token changes nothing
    assert store.tasks.task_settle([Settlement(task_id, task.lease_token, "failed", error="late")]) == {}


def test_reaper_requeues_expired_claims_without_consuming_the_attempt(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (first,) = store.tasks.task_claim(["default"], 1, "a", 30)
    _expire(db, task_id)
    assert store.tasks.task_reclaim_expired(max_reclaims=10) == [
        (task_id, "default", "queued", "t.noop", 0, "lease of a expired (reclaim 1)")]
    row = db.execute("SELECT state, reclaims, attempts FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
    assert row == ("queued", 1, 0)
    (second,) = store.tasks.task_claim(["default"], 1, "b", 30)
    assert second.lease_token > first.lease_token and second.attempt == 1
    # the zombie's late completion is refused; the new holder's is applied
    assert store.tasks.task_settle([Settlement(task_id, first.lease_token, "completed", result="zombie")]) == {}
    assert store.tasks.task_settle([Settlement(task_id, second.lease_token, "completed", result="b")]) == {task_id: "completed"}
    types = [t for (t,) in db.execute("SELECT type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                                      (task_id,))]
    assert types == ["queued", "running", "reclaimed", "running", "completed"]


def test_reclaim_budget_exhausted_fails_the_task(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    store.tasks.task_claim(["default"], 1, "a", 30)
    db.execute("UPDATE skiplock.tasks SET reclaims = 2 WHERE id = %s", (task_id,))
    _expire(db, task_id)
    assert store.tasks.task_reclaim_expired(max_reclaims=2) == [
        (task_id, "default", "failed", "t.noop", 1, "lease of a expired (reclaim 3)")]
    state, error, finished = db.execute(
        "SELECT state, last_error, finished_at FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
    assert state == "failed" and "expired (reclaim 3)" in error and finished is not None


def test_expired_cancelling_claim_becomes_cancelled(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    store.tasks.task_claim(["default"], 1, "a", 30)
    assert store.tasks.task_cancel(task_id) == "cancelling"
    _expire(db, task_id)
    assert [r[:3] for r in store.tasks.task_reclaim_expired(max_reclaims=10)] == [(task_id, "default", "cancelled")]


def test_two_reapers_never_reclaim_the_same_row(store: Store, db_url, db):
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 300)
    store.tasks.task_claim(["default"], 300, "a", 30)
    db.execute("UPDATE skiplock.tasks SET lease_until = now() - interval '1 second'")
    other = Store(db_url).open(wait=True)
    import threading

    results: list = []
    threads = [threading.Thread(target=lambda s=s: results.extend(s.tasks.task_reclaim_expired(10, limit=50)))
               for s in (store, other, store, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while True:
        more = store.tasks.task_reclaim_expired(10, limit=50)
        if not more:
            break
        results.extend(more)
    other.close()
    assert len(results) == 300 and len({r[0] for r in results}) == 300
    assert db.execute("SELECT sum(reclaims) FROM skiplock.tasks").fetchone()[0] == 300


def test_release_gives_the_attempt_back(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (task,) = store.tasks.task_claim(["default"], 1, "a", 30)
    assert store.tasks.task_settle([Settlement(task_id, task.lease_token, "released")]) == {task_id: "queued"}
    assert db.execute("SELECT attempts, state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone() == \
        (0, "queued")


def test_retry_past_the_deadline_fails(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {}, max_attempts=10)
    (task,) = store.tasks.task_claim(["default"], 1, "a", 30)
    time.sleep(0.05)  # let the task age past a tiny deadline
    applied = store.tasks.task_settle([Settlement(task_id, task.lease_token, "retry", error="x", delay=1,
                                       deadline_seconds=0.5)])
    assert applied == {task_id: "failed"}


def _behind_a_concurrent_update(db_url, task_id, assignment: str, write):
    """Run `write()` while another transaction holds the task's row, updated by `assignment`;
    commit that transaction once `write` is waiting on the row lock. Returns write()'s result."""
    import threading

    import psycopg

    result = {}
    with psycopg.connect(db_url) as other:
        other.execute(f"UPDATE skiplock.tasks SET {assignment} WHERE id = %s", (task_id,))
        thread = threading.Thread(target=lambda: result.update(value=write()))
        thread.start()
        waiting = 0
        deadline = time.monotonic() + 10
        while waiting == 0 and time.monotonic() < deadline:
            with psycopg.connect(db_url, autocommit=True) as probe:
                waiting = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND datname = current_database()").fetchone()[0]
            time.sleep(0.02)
        assert waiting == 1, "the write never waited for the row lock"
        other.commit()
        thread.join(10)
    return result["value"]


def test_writes_that_wait_behind_a_concurrent_row_update_still_apply(store: Store, db_url, db):
    # The row the snapshot saw is replaced while the write waits for its lock: the write must
    # follow it to the new version (a settle or heartbeat that missed it would be counted as a
    # stale write, and the finished task reclaimed and run again).
    ids = [skiplock.enqueue(db_url, "t.noop", {"i": i}) for i in range(3)]
    tasks = {t.id: t for t in store.tasks.task_claim(["default"], 3, "a", 30)}
    assert set(tasks) == set(ids)

    beat = _behind_a_concurrent_update(db_url, ids[0], "message = 'concurrent'",
                                       lambda: store.tasks.task_heartbeat([(i, tasks[i].lease_token) for i in ids], 30))
    assert beat == {i: "running" for i in ids}

    settled = _behind_a_concurrent_update(
        db_url, ids[1], "lease_until = now() + interval '60 seconds'",
        lambda: store.tasks.task_settle([Settlement(i, tasks[i].lease_token, "completed") for i in ids[:2]]))
    assert settled == {ids[0]: "completed", ids[1]: "completed"}

    assert db.execute("SELECT state, count(*) FROM skiplock.tasks GROUP BY state ORDER BY state").fetchall() == \
        [("completed", 2), ("running", 1)]
    assert db.execute("SELECT count(*) FROM skiplock.task_events WHERE type = 'completed'").fetchone()[0] == 2


def test_a_cancel_committed_while_an_outcome_waits_still_wins(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (task,) = store.tasks.task_claim(["default"], 1, "a", 30)
    settled = _behind_a_concurrent_update(
        db_url, task_id, "state = 'cancelling'",
        lambda: store.tasks.task_settle([Settlement(task_id, task.lease_token, "retry", error="boom", delay=0)]))
    assert settled == {task_id: "cancelled"}
    assert db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone() == ("cancelled",)

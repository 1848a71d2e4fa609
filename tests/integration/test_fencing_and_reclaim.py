"""Fenced writes and the reclaim, statement by statement."""

from __future__ import annotations

import time

import skiplock
from skiplock.engine.model import BUSY, Settlement
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


def test_reclaim_requeues_expired_claims_without_consuming_the_attempt(store: Store, db_url, db):
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


def test_two_reclaims_never_take_the_same_row(store: Store, db_url, db):
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 300)
    store.tasks.task_claim(["default"], 300, "a", 30)
    db.execute("UPDATE skiplock.tasks SET lease_until = now() - interval '1 second'")
    other = Store.pooled(db_url).open(wait=True)
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


def _while_another_transaction_holds(db_url, task_id, assignment: str, write):
    """Run `write()` while another transaction holds the task's row, updated by `assignment`, then
    again once that transaction committed. Returns both results. A write that waited for the row
    lock would never return while the other transaction is open: it fails the test instead."""
    import threading

    import psycopg

    result = {}
    with psycopg.connect(db_url) as other:
        other.execute(f"UPDATE skiplock.tasks SET {assignment} WHERE id = %s", (task_id,))
        thread = threading.Thread(target=lambda: result.update(during=write()), daemon=True)
        thread.start()
        thread.join(10)
        waited = thread.is_alive()
        other.commit()
        thread.join(10)
    assert not waited, "the write waited for the row lock another transaction held"
    return result["during"], write()


def test_a_write_never_waits_for_a_row_another_transaction_holds_and_applies_when_written_again(
        store: Store, db_url, db):
    # Another transaction holds the row (another worker's claim statement can, for a moment): a
    # heartbeat or a settle neither waits nor counts it as lost, but says BUSY and changes nothing
    # there; written again after that transaction committed, it applies to the row's new version
    # (one that missed it would count a stale write, and the finished task would be run again).
    ids = [skiplock.enqueue(db_url, "t.noop", {"i": i}) for i in range(3)]
    tasks = {t.id: t for t in store.tasks.task_claim(["default"], 3, "a", 30)}
    assert set(tasks) == set(ids)
    leases = [(i, tasks[i].lease_token) for i in ids]

    during, after = _while_another_transaction_holds(db_url, ids[0], "message = 'concurrent'",
                                                     lambda: store.tasks.task_heartbeat(leases, 30))
    assert during == {ids[0]: BUSY, ids[1]: "running", ids[2]: "running"}
    assert after == {i: "running" for i in ids}

    during, after = _while_another_transaction_holds(
        db_url, ids[1], "lease_until = now() + interval '60 seconds'",
        lambda: store.tasks.task_settle([Settlement(i, tasks[i].lease_token, "completed") for i in ids[:2]]))
    assert during == {ids[0]: "completed", ids[1]: BUSY}
    assert after == {ids[1]: "completed"}  # ids[0]'s second write is refused: it is completed already

    assert db.execute("SELECT state, count(*) FROM skiplock.tasks GROUP BY state ORDER BY state").fetchall() == \
        [("completed", 2), ("running", 1)]
    assert db.execute("SELECT count(*) FROM skiplock.task_events WHERE type = 'completed'").fetchone()[0] == 2


def test_a_write_for_a_lost_claim_is_refused_even_while_its_row_is_held(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (task,) = store.tasks.task_claim(["default"], 1, "a", 30)
    db.execute("UPDATE skiplock.tasks SET lease_token = lease_token + 1 WHERE id = %s", (task_id,))
    during, after = _while_another_transaction_holds(
        db_url, task_id, "message = 'concurrent'",
        lambda: store.tasks.task_settle([Settlement(task_id, task.lease_token, "completed")]))
    assert (during, after) == ({}, {})
    assert store.tasks.task_heartbeat([(task_id, task.lease_token)], 30) == {}


def test_a_cancel_committed_while_an_outcome_was_busy_still_wins(store: Store, db_url, db):
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (task,) = store.tasks.task_claim(["default"], 1, "a", 30)
    during, after = _while_another_transaction_holds(
        db_url, task_id, "state = 'cancelling'",
        lambda: store.tasks.task_settle([Settlement(task_id, task.lease_token, "retry", error="boom", delay=0)]))
    assert (during, after) == ({task_id: BUSY}, {task_id: "cancelled"})
    assert db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone() == ("cancelled",)

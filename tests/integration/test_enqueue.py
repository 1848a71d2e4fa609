"""Enqueue: single, bulk, inside the caller's transaction, idempotent under concurrency."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest

import skiplock
from skiplock.engine.errors import InvalidInput, MigrationError, PayloadTooLarge


def test_ten_concurrent_enqueues_with_one_key_make_one_task(db_url, db):
    barrier = threading.Barrier(10)
    results: list = []
    errors: list = []

    def enqueue():
        try:
            with psycopg.connect(db_url) as conn:
                barrier.wait()
                results.append(skiplock.enqueue(conn, "t.noop", {"order": 42}, idempotency_key="order-42"))
                conn.commit()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 10 and len(set(results)) == 1
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 1


def test_enqueue_in_a_rolled_back_transaction_leaves_no_task(db_url, db):
    with psycopg.connect(db_url) as conn:
        task_id = skiplock.enqueue(conn, "t.noop", {"n": 1})
        conn.rollback()
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0] == 0
    with psycopg.connect(db_url) as conn:
        task_id = skiplock.enqueue(conn, "t.noop", {"n": 2})
        conn.commit()
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0] == 1


def test_bulk_enqueue_inserts_all_with_events_and_one_notification_per_queue(db_url, db):
    db.execute("LISTEN skiplock_skiplock")
    ids = skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(1000)])
    skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(10)], queue="other")
    assert len(ids) == 1000 and ids == sorted(ids)  # UUIDv7: creation order
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 1010
    events = db.execute("SELECT type, seq, count(*) FROM skiplock.task_events GROUP BY 1, 2").fetchall()
    assert events == [("queued", 1, 1010)]
    notes = [n.payload for n in db.notifies(timeout=0.5)]
    assert sorted(notes) == ["default", "other"]


def test_bulk_enqueue_with_keys_returns_existing_ids(db_url, db):
    first = skiplock.enqueue(db_url, "t.noop", {}, idempotency_key="k1")
    ids = skiplock.enqueue_many(db_url, "t.noop", [{}, {}, {}], idempotency_keys=["k1", "k2", "k2"])
    assert ids[0] == first
    assert ids[1] == ids[2] != first
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 2


def test_keyed_bulk_enqueue_writes_one_event_per_task_it_inserted(db_url, db):
    skiplock.enqueue(db_url, "t.noop", {}, idempotency_key="k1")
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 4, idempotency_keys=["k1", "k2", "k2", None])
    rows = db.execute("SELECT t.idempotency_key, count(e.*), min(e.seq), min(t.event_seq) FROM skiplock.tasks t "
                      "LEFT JOIN skiplock.task_events e ON e.task_id = t.id "
                      "GROUP BY 1 ORDER BY 1 NULLS LAST").fetchall()
    assert rows == [("k1", 1, 1, 1), ("k2", 1, 1, 1), (None, 1, 1, 1)]


def test_a_task_inserted_by_plain_sql_gets_its_queued_event_and_wakes_the_workers(db_url, db):
    """The database, not the client, writes a new task's first event and the wake-up: an INSERT
    that is not skiplock's own is a task like any other."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN skiplock_skiplock")
        with db.transaction():
            db.execute("INSERT INTO skiplock.tasks (id, kind, queue) "
                       "SELECT skiplock.uuid7(), 't.noop', q FROM unnest(ARRAY['a', 'a', 'b']) AS q")
            db.execute("INSERT INTO skiplock.tasks (id, kind, queue, run_after) "
                       "VALUES (skiplock.uuid7(), 't.noop', 'later', now() + interval '1 hour')")
        assert sorted(n.payload for n in listener.notifies(timeout=0.5)) == ["a", "b"]
    events = db.execute("SELECT t.queue, e.seq, e.type, e.attempt, t.event_seq FROM skiplock.tasks t "
                        "JOIN skiplock.task_events e ON e.task_id = t.id ORDER BY 1").fetchall()
    assert events == [("a", 1, "queued", 0, 1), ("a", 1, "queued", 0, 1), ("b", 1, "queued", 0, 1),
                      ("later", 1, "queued", 0, 1)]


def test_delayed_task_does_not_notify(db_url, db):
    db.execute("LISTEN skiplock_skiplock")
    skiplock.enqueue(db_url, "t.noop", {}, delay=60)
    assert list(db.notifies(timeout=0.3)) == []


def _circular():
    payload = {"items": []}
    payload["items"].append(payload)
    return payload


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        (dict(kind="bad kind!"), InvalidInput, "invalid task kind name"),
        (dict(queue=""), InvalidInput, "invalid queue name"),
        (dict(payload={"x": object()}), InvalidInput, "not JSON-serializable"),
        (dict(payload={"x": float("nan")}), InvalidInput, "not JSON-serializable"),
        (dict(payload=_circular()), InvalidInput, "not JSON-serializable: it refers to itself"),
        (dict(payload={"blob": "x" * (1024 * 1024 + 1)}), PayloadTooLarge, "limit is 1048576"),
        (dict(payload={"x": "a\x00b"}), InvalidInput, "NUL character"),
        (dict(priority="high"), InvalidInput, "priority"),
        (dict(max_attempts=0), InvalidInput, "max_attempts"),
        (dict(delay=-1), InvalidInput, "delay"),
        (dict(delay=1, run_at=__import__("datetime").datetime.now(__import__("datetime").timezone.utc)),
         InvalidInput, "either run_at or delay"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(db_url, db, kwargs, error, fragment):
    args = dict(kind="t.noop", payload={})
    args.update(kwargs)
    with pytest.raises(error, match=fragment):
        skiplock.enqueue(db_url, args.pop("kind"), args.pop("payload"), **args)
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0


def test_bulk_enqueue_joins_the_callers_transaction(db_url, db):
    with psycopg.connect(db_url) as conn:
        ids = skiplock.enqueue_many(conn, "t.noop", [{"i": i} for i in range(500)])
        assert conn.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 500
        conn.rollback()
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0
    with psycopg.connect(db_url) as conn:
        ids = skiplock.enqueue_many(conn, "t.noop", [{"i": i} for i in range(500)], priority=2)
        conn.commit()
    rows = db.execute("SELECT count(*), min(priority), max(event_seq), min(run_after) <= now() "
                      "FROM skiplock.tasks WHERE id = ANY(%s)", (ids,)).fetchone()
    assert rows == (500, 2, 1, True)


@pytest.mark.parametrize("n", [1, 10, 500])  # one statement, arrays, COPY
def test_created_at_is_when_each_row_was_written_and_run_after_the_transactions_start(db_url, n):
    """Migration 0009: created_at and updated_at default to clock_timestamp(), which also makes
    COPY insert row by row (faster here than its buffered multi-insert); run_after stays now()."""
    with psycopg.connect(db_url) as conn:
        started = conn.execute("SELECT now()").fetchone()[0]
        conn.execute("SELECT pg_sleep(0.2)")
        ids = skiplock.enqueue_many(conn, "t.noop", [{"i": i} for i in range(n)])
        rows = conn.execute(
            "SELECT t.created_at, t.updated_at, t.run_after, e.at FROM skiplock.tasks t "
            "JOIN skiplock.task_events e ON e.task_id = t.id AND e.seq = 1 "
            "WHERE t.id = ANY(%s) ORDER BY t.id", (ids,)).fetchall()
        conn.commit()
    assert len(rows) == n
    assert all(created - started >= dt.timedelta(seconds=0.2) for created, _, _, _ in rows)
    assert all(updated >= created for created, updated, _, _ in rows)
    assert {(run_after, at) for _, _, run_after, at in rows} == {(started, started)}
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)  # written in the order of their ids


@pytest.mark.parametrize("bad_at", [0, 200, 999])  # in the COPY's first piece, or after pieces went out
@pytest.mark.parametrize("via", ["url", "autocommit connection"])  # a transaction of ours, or the COPY alone
def test_bulk_enqueue_refuses_one_bad_payload_and_writes_nothing(db_url, db, bad_at, via):
    payloads = [{"i": i} for i in range(1000)]
    payloads[bad_at] = {"bad": object()}
    with pytest.raises(InvalidInput, match="not JSON-serializable"):
        if via == "url":
            skiplock.enqueue_many(db_url, "t.noop", payloads)
        else:
            with psycopg.connect(db_url, autocommit=True) as conn:
                skiplock.enqueue_many(conn, "t.noop", payloads)
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 0


def test_a_payload_refused_halfway_through_a_bulk_enqueue_leaves_the_callers_transaction_usable(
        db_url, db, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_MAX_PAYLOAD_BYTES", "1000")
    payloads = [{"i": i} for i in range(700)]
    payloads[600] = {"big": "x" * 2000}
    with psycopg.connect(db_url) as conn:
        before = skiplock.enqueue(conn, "t.noop", {"before": True})
        with pytest.raises(PayloadTooLarge, match="the limit is 1000"):
            skiplock.enqueue_many(conn, "t.noop", payloads)
        after = skiplock.enqueue(conn, "t.noop", {"after": True})
        conn.commit()
    assert {r[0] for r in db.execute("SELECT id FROM skiplock.tasks")} == {before, after}
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 2
    # the same in a transaction block on an autocommit connection
    with psycopg.connect(db_url, autocommit=True) as conn:
        with conn.transaction():
            inside = skiplock.enqueue(conn, "t.noop", {"inside": True})
            with pytest.raises(PayloadTooLarge, match="the limit is 1000"):
                skiplock.enqueue_many(conn, "t.noop", payloads)
            assert conn.execute("SELECT count(*) FROM skiplock.tasks WHERE id = %s", (inside,)).fetchone()[0] == 1
    assert {r[0] for r in db.execute("SELECT id FROM skiplock.tasks")} == {before, after, inside}
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 3
    # and the same bulk without the big payload goes in whole, in the caller's transaction
    del payloads[600]
    with psycopg.connect(db_url) as conn:
        ids = skiplock.enqueue_many(conn, "t.noop", payloads)
        conn.commit()
    assert db.execute("SELECT count(*), count(DISTINCT id) FROM skiplock.tasks WHERE id = ANY(%s)",
                      (ids,)).fetchone() == (699, 699)
    # and on an autocommit connection, where the COPY is its own transaction
    with psycopg.connect(db_url, autocommit=True) as conn:
        ids = skiplock.enqueue_many(conn, "t.noop", payloads)
    assert db.execute("SELECT count(*) FROM skiplock.task_events WHERE task_id = ANY(%s)",
                      (ids,)).fetchone()[0] == 699


def test_bulk_copy_keeps_awkward_payloads_intact(db_url, db):
    awkward = [{"text": "tab\there", "nl": "line\nbreak", "bs": "C:\\path\\n", "q": "it's \"quoted\"",
                "uni": "żółć 漢字 🚀", "n": i, "nested": [None, True, 1.5, {"\\N": "\\."}]} for i in range(100)]
    ids = skiplock.enqueue_many(db_url, "t.noop", awkward, max_attempts=4)
    rows = db.execute("SELECT payload, max_attempts FROM skiplock.tasks WHERE id = ANY(%s)", (ids,)).fetchall()
    assert sorted((r[0] for r in rows), key=lambda p: p["n"]) == awkward
    assert {r[1] for r in rows} == {4}
    ids_default = skiplock.enqueue_many(db_url, "t.noop", [{}] * 100)
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND max_attempts IS NULL",
                      (ids_default,)).fetchone()[0] == 100


def test_one_task_and_a_small_batch_store_the_same_fields(db_url, db):
    """A single enqueue has a statement of its own (plain parameters); a batch below the COPY
    threshold goes through arrays. Both store the same row."""
    at = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    kwargs = dict(queue="q1", priority=3, max_attempts=7)

    def row(task_id):
        *fields, run_after, created_at = db.execute(
            "SELECT kind, queue, priority, payload, max_attempts, idempotency_key, state, event_seq, run_after, "
            "created_at FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
        # a delay as whole seconds after creation, a run_at as given
        return (*fields, run_after if run_after - created_at > dt.timedelta(days=1)
                else round((run_after - created_at).total_seconds()))

    def keyed_row(enqueue):
        task_id = enqueue()
        found = row(task_id)
        db.execute("DELETE FROM skiplock.tasks WHERE id = %s", (task_id,))  # the key is free again
        return found

    one = [row(skiplock.enqueue(db_url, "t.noop", {"x": 1}, delay=120, **kwargs)),
           row(skiplock.enqueue(db_url, "t.noop", {"x": 1}, run_at=at, **kwargs)),
           keyed_row(lambda: skiplock.enqueue(db_url, "t.noop", None, idempotency_key="same", **kwargs))]
    many = [row(skiplock.enqueue_many(db_url, "t.noop", [{"x": 1}] * 2, delay=120, **kwargs)[1]),
            row(skiplock.enqueue_many(db_url, "t.noop", [{"x": 1}] * 2, run_at=at, **kwargs)[1]),
            keyed_row(lambda: skiplock.enqueue_many(db_url, "t.noop", [None, None], idempotency_keys=["same", None],
                                                    **kwargs)[0])]
    assert one == many
    assert one[0] == ("t.noop", "q1", 3, {"x": 1}, 7, None, "queued", 1, 120)
    assert one[1][8] == at
    assert one[2] == ("t.noop", "q1", 3, {}, 7, "same", "queued", 1, 0)  # no payload: {}


@pytest.mark.parametrize("n", [64, 96, 97, 1000, 1001])  # the COPY's pieces end after rows 32, 96, 224, 480, ...
@pytest.mark.parametrize("keys", [None, "all None"])
def test_bulk_ids_match_their_payloads_across_the_copys_pieces(db_url, db, n, keys):
    payloads = [{"n": i} for i in range(n)]
    ids = skiplock.enqueue_many(db_url, "t.noop", payloads, idempotency_keys=[None] * n if keys else None)
    stored = dict(db.execute("SELECT id, (payload->>'n')::int FROM skiplock.tasks").fetchall())
    assert len(ids) == len(set(ids)) == len(stored) == n
    assert [stored[task_id] for task_id in ids] == list(range(n))
    assert db.execute("SELECT count(*) FROM skiplock.task_events WHERE type = 'queued'").fetchone()[0] == n


@pytest.mark.parametrize("via", ["url", "connection in a transaction"])
def test_enqueue_refuses_a_schema_without_migration_0007_and_writes_nothing(db_url, db, via):
    """Since 0007 the database writes a task's 'queued' event and the wake-up; into an older
    schema a task would be stored without either, so enqueue says to migrate instead."""
    db.execute("DROP TRIGGER tasks_inserted ON skiplock.tasks")  # the schema as it was before 0007
    db.execute("LISTEN skiplock_skiplock")
    for enqueue in (lambda target: skiplock.enqueue(target, "t.noop", {}),
                    lambda target: skiplock.enqueue_many(target, "t.noop", [{"i": i} for i in range(100)])):
        with pytest.raises(MigrationError, match=r"lacks migration 0007.*run `skiplock migrate`"):
            if via == "url":
                enqueue(db_url)
            else:
                with psycopg.connect(db_url) as conn:
                    before = conn.execute("SELECT 1").fetchone()  # the caller's transaction is open
                    try:
                        enqueue(conn)
                    finally:
                        # our check only read the catalog: the caller's transaction is still usable
                        assert conn.execute("SELECT 2").fetchone() == (2,) and before == (1,)
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0
    assert list(db.notifies(timeout=0.2)) == []

"""enqueue_async and enqueue_many_async: the caller's AsyncConnection and transaction, or a URL,
with the sync calls' semantics, errors and idempotency (they run the same plan:
engine/store/task_inserts.py)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import skiplock
from skiplock.engine.errors import InvalidInput, MigrationError, PayloadTooLarge


def run(coro):
    return asyncio.run(coro)


def count(db, where="true", *params) -> int:
    return db.execute(f"SELECT count(*) FROM skiplock.tasks WHERE {where}", params).fetchone()[0]


def test_a_task_exists_only_if_the_async_transaction_commits(db_url, db):
    async def go():
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            rolled_back = await skiplock.enqueue_async(conn, "t.noop", {"n": 1})
            await conn.rollback()
            async with conn.transaction():
                committed = await skiplock.enqueue_async(conn, "t.noop", {"n": 2}, priority=5, queue="q2")
        return rolled_back, committed

    rolled_back, committed = run(go())
    assert count(db, "id = %s", rolled_back) == 0
    assert db.execute("SELECT kind, queue, priority, payload, state FROM skiplock.tasks WHERE id = %s",
                      (committed,)).fetchone() == ("t.noop", "q2", 5, {"n": 2}, "queued")
    assert db.execute("SELECT count(*) FROM skiplock.task_events WHERE task_id = %s AND type = 'queued'",
                      (committed,)).fetchone()[0] == 1


def test_a_url_commits_before_returning_and_keys_are_idempotent(db_url, db):
    async def go():
        first = await skiplock.enqueue_async(db_url, "t.noop", {"order": 7}, idempotency_key="order-7")
        again = await skiplock.enqueue_async(db_url, "t.noop", {"order": 7}, idempotency_key="order-7")
        many = await skiplock.enqueue_many_async(db_url, "t.noop", [{"i": 1}, {"i": 2}, {"i": 3}],
                                                 idempotency_keys=["order-7", "k2", "k2"])
        return first, again, many

    first, again, many = run(go())
    assert first == again == many[0]
    assert many[1] == many[2] != first
    assert count(db) == 2


def test_ten_concurrent_async_enqueues_with_one_key_make_one_task(db_url, db):
    async def one():
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            task_id = await skiplock.enqueue_async(conn, "t.noop", {}, idempotency_key="same")
            await conn.commit()
            return task_id

    async def go():
        return await asyncio.gather(*(one() for _ in range(10)))

    ids = run(go())
    assert len(set(ids)) == 1 and count(db) == 1


@pytest.mark.parametrize("n", [10, 500])  # 500: the COPY path
def test_a_refused_batch_in_an_open_transaction_rolls_back_to_its_savepoint_only(db_url, db, n):
    payloads = [{"i": i} for i in range(n)]
    payloads[n // 2] = {"bad": float("nan")}

    async def go():
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            kept = await skiplock.enqueue_async(conn, "t.noop", {"before": True})
            with pytest.raises(InvalidInput):
                await skiplock.enqueue_many_async(conn, "t.noop", payloads)
            # the caller's transaction is intact and usable
            good = await skiplock.enqueue_many_async(conn, "t.noop", [{"i": i} for i in range(n)])
            await conn.commit()
            return kept, good

    kept, good = run(go())
    assert count(db, "id = %s", kept) == 1
    assert count(db) == 1 + n and len(good) == n
    assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 1 + n


def test_the_copy_path_on_an_idle_autocommit_connection_is_one_statement(db_url, db):
    async def go():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            ids = await skiplock.enqueue_many_async(conn, "t.noop", [{"i": i} for i in range(300)])
            with pytest.raises(PayloadTooLarge):
                await skiplock.enqueue_many_async(conn, "t.noop", [{"i": 0}] * 100 + [{"x": "y" * 2_000_000}])
            return ids

    ids = run(go())
    assert len(ids) == 300 and ids == sorted(ids)
    assert count(db) == 300


def test_dependencies_and_bad_input_behave_as_the_sync_calls_do(db_url, db):
    parent = skiplock.enqueue(db_url, "t.noop", {})

    async def go():
        child = await skiplock.enqueue_async(db_url, "t.noop", {}, depends_on=[parent])
        errors = []
        for call in (lambda: skiplock.enqueue_async(db_url, "bad kind!", {}),
                     lambda: skiplock.enqueue_async(db_url, "t.noop", {}, priority=10**6),
                     lambda: skiplock.enqueue_async(db_url, "t.noop", {}, depends_on=[
                         "01890000-0000-7000-8000-000000000000"]),
                     lambda: skiplock.enqueue_many_async(db_url, "t.noop", [{}, {}], idempotency_keys=["a"])):
            with pytest.raises(InvalidInput) as info:
                await call()
            errors.append(str(info.value))
        return child, errors

    child, errors = run(go())
    assert db.execute("SELECT state, waiting_on FROM skiplock.tasks WHERE id = %s", (child,)).fetchone() == ("waiting", 1)
    assert len(errors) == 4 and all("\n" not in e for e in errors)
    assert "depends_on: no task" in errors[2]
    assert count(db) == 2


def test_each_call_refuses_the_other_kind_of_connection_in_one_line(db_url, db):
    async def go():
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            with pytest.raises(InvalidInput, match="use `await skiplock.enqueue_async"):
                skiplock.enqueue(aconn, "t.noop", {})
        with psycopg.connect(db_url) as conn:
            with pytest.raises(InvalidInput, match="enqueue_async got a psycopg Connection"):
                await skiplock.enqueue_async(conn, "t.noop", {})
        with pytest.raises(InvalidInput, match="AsyncConnection or a postgresql:// URL"):
            await skiplock.enqueue_many_async(42, "t.noop", [{}])
        assert await skiplock.enqueue_many_async(db_url, "t.noop", []) == []

    run(go())
    assert count(db) == 0


def test_a_schema_never_migrated_is_refused(db_url, db):
    async def go():
        with pytest.raises(MigrationError, match="run `skiplock migrate`"):
            await skiplock.enqueue_async(db_url, "t.noop", {}, schema="nowhere")

    run(go())

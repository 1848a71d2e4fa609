"""Task handles (issue 34, section 1): @skiplock.task returns a handle that is still the function
and enqueues its own kind, in the queue it declared, with the module functions' options; a typed
kind takes a model instance. (That a type checker sees the payload type: tests/unit/
test_task_handle_types.py.)"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import skiplock
from skiplock.engine.errors import InvalidInput
from skiplock.engine.registry import REGISTRY, Registry
from tests.support.handlers import note
from tests.support.typed_handlers import ship
from tests.support.typed_models import Order


def test_a_handle_is_the_function_and_its_definition():
    assert ship(None, Order(order_id=7))["order_id"] == 7  # calling it runs the handler
    assert isinstance(note, skiplock.TaskHandle) and note.kind == "t.note" and note.__name__ == "note"
    assert REGISTRY.get("t.note").fn is note.fn and note.definition.queue == "notes"
    assert "Records the execution" in note.__doc__


def test_enqueue_uses_the_declared_queue_and_the_module_options(db_url, db):
    first = note.enqueue(db_url, {"n": 1})
    other = note.enqueue(db_url, {"n": 2}, queue="elsewhere", priority=7, idempotency_key="k1")
    replay = note.enqueue(db_url, {"n": 2}, queue="elsewhere", idempotency_key="k1")
    assert (first.created, other.created, replay.created, replay) == (True, True, False, other)
    rows = db.execute("SELECT kind, queue, priority, payload FROM skiplock.tasks ORDER BY id").fetchall()
    assert rows == [("t.note", "notes", 0, {"n": 1}), ("t.note", "elsewhere", 7, {"n": 2})]
    ids = note.enqueue_many(db_url, [{"n": n} for n in range(3)], unique=skiplock.Unique())
    assert [i.created for i in ids] == [True, False, False]


def test_the_async_twins(db_url, db):
    async def main():
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            one = await note.enqueue_async(conn, {"n": 1})
            many = await note.enqueue_many_async(conn, [{"n": 2}, {"n": 3}])
            await conn.commit()
        return [one, *many]

    ids = asyncio.run(main())
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE queue = 'notes' AND id = ANY(%s)",
                      (ids,)).fetchone()[0] == 3


def test_a_typed_kind_takes_a_model_instance_and_refuses_a_bad_payload(db_url, db):
    task_id = ship.enqueue(db_url, Order(order_id=3, qty=2))
    stored = db.execute("SELECT kind, payload FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
    assert stored == ("typed.order", {"order_id": 3, "qty": 2, "address": None, "tags": []})
    with pytest.raises(InvalidInput, match="payload of typed.order: 1 validation error for Order"):
        ship.enqueue(db_url, {"qty": 1})
    assert skiplock.task("t.again", registry=Registry())(note).fn is note.fn  # @task over a handle: its handler

"""The backend in the web process, against the real database, no worker: enqueue joins Django's
transaction (or, on a database of skiplock's own, commits at once), what get_result reads back,
the supports_* flags, and bad input refused with one line."""

from __future__ import annotations

import asyncio
import datetime as dt

import psycopg
import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.test import Client, override_settings
from django.utils import timezone

import skiplock
from tests.examples import shop as shop_mod
from tests.support import harness


def _tasks(conn) -> list[tuple]:
    return conn.execute("SELECT kind, queue, priority, payload, max_attempts, state FROM skiplock.tasks "
                        "ORDER BY id").fetchall()


def test_the_flags_say_what_the_backend_does(shop):
    backend = default_task_backend
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)


def test_an_enqueue_in_atomic_commits_or_rolls_back_with_the_block(shop):
    from orders.models import Order
    from orders.tasks import send_receipt

    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(item_id="widget", quantity=1)
        send_receipt.enqueue(order.id)
        assert harness.scalar(shop, "SELECT count(*) FROM skiplock.tasks") == 0  # not committed yet
        raise RuntimeError("the view failed after the enqueue")
    assert _tasks(shop) == []

    with transaction.atomic():
        order = Order.objects.create(item_id="widget", quantity=1)
        result = send_receipt.enqueue(order.id)
        # read back in the same transaction: the backend reads on Django's connection
        assert send_receipt.get_result(result.id).status == TaskResultStatus.READY
    assert _tasks(shop) == [("orders.tasks.send_receipt", "emails", 0, {"args": [order.id], "kwargs": {}}, 1,
                             "queued")]
    assert result.status == TaskResultStatus.READY and result.args == [order.id] and result.kwargs == {}


def test_a_view_places_an_order_with_its_task_and_a_refused_one_leaves_neither(shop):
    client = Client()
    refused = client.post("/orders", {"item": "widget", "quantity": shop_mod.STOCK + 1}, content_type="application/json")
    assert refused.status_code == 409
    assert shop_mod.counts(shop) == {"orders": 0, "receipts": 0, "tasks": 0, "completed": 0, "stock": shop_mod.STOCK}
    placed = client.post("/orders", {"item": "widget", "quantity": 2}, content_type="application/json")
    assert placed.status_code == 201
    assert shop_mod.counts(shop) == {"orders": 1, "receipts": 0, "tasks": 1, "completed": 0,
                                     "stock": shop_mod.STOCK - 2}
    status = client.get(f"/tasks/{placed.json()['task_id']}")
    assert status.json() == {"status": "READY", "attempts": 0}


def test_priority_queue_run_after_and_options_reach_the_row(shop):
    from orders.tasks import charge, send_receipt

    later = timezone.now() + dt.timedelta(hours=1)
    charge.using(priority=-100).enqueue(1, 10)
    charge.using(priority=100, run_after=later).enqueue(2, 20)
    send_receipt.using(queue_name="default").with_options(idempotency_key="receipt-3").enqueue(3)
    again = send_receipt.using(queue_name="default").with_options(idempotency_key="receipt-3").enqueue(3)
    rows = shop.execute("SELECT priority, queue, run_after, idempotency_key FROM skiplock.tasks ORDER BY id").fetchall()
    assert [(r[0], r[1], r[3]) for r in rows] == [(-100, "default", None), (100, "default", None),
                                                  (0, "default", "receipt-3")]
    assert rows[1][2] == later
    assert again.id == str(shop.execute("SELECT id FROM skiplock.tasks WHERE idempotency_key = 'receipt-3'").fetchone()[0])


def test_get_result_reads_what_the_row_says(shop):
    from orders.tasks import charge

    result = charge.using(priority=7).enqueue(1, 10)
    read = charge.get_result(result.id)
    assert read == result  # enqueue returns the row as stored (Django's own test_get_result asks this)
    assert (read.id, read.status, read.args, read.kwargs, read.backend, read.errors, read.worker_ids) == (
        result.id, TaskResultStatus.READY, [1, 10], {}, "default", [], [])
    assert read.task.func is charge.func and read.task.priority == 7
    assert read.enqueued_at is not None and read.started_at is None and read.finished_at is None
    shop.execute("UPDATE skiplock.tasks SET state = 'cancelled', finished_at = now() WHERE id = %s", (result.id,))
    read.refresh()
    assert read.status == TaskResultStatus.FAILED and read.is_finished  # Django has no cancelled status


def test_async_enqueue_and_get_result(shop):
    from orders.tasks import stock_report

    async def enqueue_and_read():
        result = await stock_report.aenqueue("widget")
        return result, await stock_report.aget_result(result.id)

    result, read = asyncio.run(enqueue_and_read())
    assert read.status == TaskResultStatus.READY and read.args == ["widget"] and read.id == result.id


def test_get_result_of_no_task_or_not_a_django_task_says_so(shop):
    with pytest.raises(TaskResultDoesNotExist, match="a skiplock task id is a UUID"):
        default_task_backend.get_result("123")
    with pytest.raises(TaskResultDoesNotExist, match="no task"):
        default_task_backend.get_result("01a23f0b-9e41-75f6-8abc-1d1f7a2adc7a")
    plain = skiplock.enqueue(shop, "shop.send_receipt", {"order_id": 1})
    with pytest.raises(TaskResultDoesNotExist, match="not the module path of a Django task"):
        default_task_backend.get_result(str(plain))


def test_bad_input_is_refused_with_one_line(shop):
    from orders.tasks import charge

    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        charge.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue 'bulk' is not valid for backend"):
        charge.using(queue_name="bulk")
    with pytest.raises(InvalidTask, match="bogus is not an option of skiplock.enqueue"):
        charge.with_options(bogus=1)
    with pytest.raises(TypeError, match="Unsupported type"):  # Django's own rule for arguments
        charge.enqueue(dt.datetime.now(), 1)
    for options, message in [({"NOPE": 1}, "unknown option NOPE"), ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS 0: must be"),
                             ({"DATABASE": "default", "DATABASE_URL": "postgresql://x/y"}, "not both"),
                             ({"RETRY_BASE": 10, "RETRY_CAP": 1}, "RETRY_CAP 1 is below RETRY_BASE 10"),
                             ({"SCHEMA": "no such"}, "invalid schema name")]:
        with override_settings(TASKS={"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend",
                                                  "OPTIONS": options}}):
            with pytest.raises(InvalidTaskBackend, match=message) as raised:
                task_backends["default"]
            assert "\n" not in str(raised.value)


@pytest.fixture
def own_database(pg_server_url, template_db):
    """A second migrated database: skiplock's own, not Django's."""
    from tests.conftest import clone_database, drop_database

    name, url = clone_database(pg_server_url, template_db)
    yield url
    drop_database(pg_server_url, name)


def test_on_a_database_of_its_own_enqueue_commits_at_once_whatever_the_block_does(shop, own_database):
    """DATABASE_URL: the task is committed on skiplock's connection before enqueue returns, so a
    rolled-back block keeps it (enqueue from transaction.on_commit to tie it to the block)."""
    from orders.models import Order
    from orders.tasks import stock_report

    with override_settings(TASKS={"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend",
                                              "OPTIONS": {"DATABASE_URL": own_database}}}):
        with pytest.raises(RuntimeError), transaction.atomic():
            Order.objects.create(item_id="widget", quantity=1)
            result = stock_report.enqueue("widget")
            raise RuntimeError("rolled back")
        assert harness.scalar(shop, "SELECT count(*) FROM orders") == 0
        assert harness.scalar(shop, "SELECT count(*) FROM skiplock.tasks") == 0  # not in Django's database
        with psycopg.connect(own_database) as conn:
            assert _tasks(conn) == [("orders.tasks.stock_report", "default", 0, {"args": ["widget"], "kwargs": {}},
                                     1, "queued")]
        assert stock_report.get_result(result.id).status == TaskResultStatus.READY

        async def natively_async():
            queued = await stock_report.aenqueue("gadget")
            return await stock_report.aget_result(queued.id)

        assert asyncio.run(natively_async()).args == ["gadget"]


def test_a_worker_takes_the_backends_database_when_the_environment_names_none(shop, django_project, own_database):
    """What `skiplock worker --django` connects to without SKIPLOCK_DATABASE_URL or SKIPLOCK_DB_SCHEMA:
    the Django database the backend names, or its DATABASE_URL and SCHEMA."""
    from skiplock.contrib.django.worker import setup
    from skiplock.engine.settings import Settings

    derived = setup(None, Settings.from_env({}))
    expected = psycopg.conninfo.conninfo_to_dict(django_project)
    assert {k: v for k, v in psycopg.conninfo.conninfo_to_dict(derived.database_url).items() if k in expected} == expected
    assert derived.db_schema == "skiplock"
    with override_settings(TASKS={"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend",
                                              "OPTIONS": {"DATABASE_URL": own_database, "SCHEMA": "elsewhere"}}}):
        derived = setup(None, Settings.from_env({}))
    assert (derived.database_url, derived.db_schema) == (own_database, "elsewhere")


def test_unique_and_debounce_reach_django_tasks_through_with_options(shop):
    from orders.tasks import send_receipt, stock_report

    unique = stock_report.with_options(unique=skiplock.Unique(by_payload=True, period=3600))
    first, again, other = unique.enqueue("widget"), unique.enqueue("widget"), unique.enqueue("gadget")
    assert first.id == again.id != other.id
    debounced = send_receipt.with_options(debounce=skiplock.Debounce(key="order-9", delay=60))
    merged = [debounced.enqueue(9, attempt) for attempt in range(3)]
    assert len({r.id for r in merged}) == 1 and merged[-1].args == [9, 2]  # the last enqueue's arguments
    assert harness.scalar(shop, "SELECT count(*) FROM skiplock.tasks") == 3

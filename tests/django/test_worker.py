"""Django tasks run by a real worker (`skiplock worker --django`, `manage.py skiplock_worker`):
results read back, priorities, run_after, an async task, retries with backoff (per task and from
the backend's OPTIONS), takes_context, a failure's TaskError, and Django's connections closed
after each task."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys

import pytest
from django.tasks import TaskResultStatus
from django.test import Client, override_settings
from django.utils import timezone

from tests.django.conftest import EXAMPLE_DIR, finished, run_command
from tests.examples import shop as shop_mod
from tests.support import harness


def test_a_placed_order_is_sent_its_receipt_and_the_result_reads_back(shop, django_worker):
    django_worker()
    client = Client()
    placed = client.post("/orders", {"item": "widget", "quantity": 2}, content_type="application/json")
    assert placed.status_code == 201
    body = placed.json()
    harness.wait_for(lambda: client.get(f"/tasks/{body['task_id']}").json()["status"] == "SUCCESSFUL",
                     60, message="the receipt task succeeded")
    assert client.get(f"/tasks/{body['task_id']}").json() == {
        "status": "SUCCESSFUL", "attempts": 1, "return_value": {"order_id": body["order_id"]}}
    assert shop_mod.counts(shop) == {"orders": 1, "receipts": 1, "tasks": 1, "completed": 1,
                                     "stock": shop_mod.STOCK - 2}
    from orders.tasks import send_receipt

    result = send_receipt.get_result(body["task_id"])
    assert result.worker_ids and result.worker_ids[0].count(":") == 2  # the worker's name, host:pid:suffix
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at


def test_higher_priorities_run_first(shop, django_worker):
    from orders.tasks import charge

    priorities = [0, 50, -50, 100, 10, -100]
    results = [charge.using(priority=p).enqueue(i, 1) for i, p in enumerate(priorities)]  # before the worker starts
    django_worker(SKIPLOCK_CONCURRENCY="1")
    started = sorted((finished(r).started_at, r.task.priority) for r in results)
    assert [p for _, p in started] == sorted(priorities, reverse=True)


def test_run_after_holds_the_task_until_then(shop, django_worker):
    from orders.tasks import stock_report

    django_worker()
    run_after = timezone.now() + dt.timedelta(seconds=3)
    result = stock_report.using(run_after=run_after).enqueue("widget")
    assert result.status == TaskResultStatus.READY
    finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.started_at >= run_after


def test_an_async_task_is_awaited_and_its_value_read_back(shop, django_worker):
    from orders.tasks import stock_report

    django_worker()
    result = finished(stock_report.enqueue("widget"))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL,
                                                    {"item": "widget", "available": shop_mod.STOCK})


def test_a_failing_task_is_retried_with_backoff_and_its_context_counts_the_attempts(shop, django_worker):
    from orders.tasks import ErpUnavailable, sync_to_erp

    django_worker()
    result = finished(sync_to_erp.enqueue(7, fail_times=2))  # @task(takes_context=True, max_attempts=3, ...)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"order_id": 7, "attempt": 3, "result_id": result.id}
    assert result.attempts == 3 and len(result.worker_ids) == 3
    assert [e.exception_class for e in result.errors] == [ErpUnavailable, ErpUnavailable]
    assert "ERP down (attempt 1)" in result.errors[0].traceback and "ERP down (attempt 2)" in result.errors[1].traceback


def test_a_task_that_keeps_failing_is_failed_with_its_error(shop, django_worker):
    from orders.tasks import PaymentDeclined, charge

    django_worker()
    result = finished(charge.enqueue(3, 5000))  # MAX_ATTEMPTS 1 in the example's OPTIONS: Django's semantics
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    (error,) = result.errors
    assert error.exception_class_path == "orders.tasks.PaymentDeclined" and error.exception_class is PaymentDeclined
    assert "Traceback (most recent call last)" in error.traceback and "over the card's limit" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value


def test_retries_come_from_the_backend_options(shop, django_worker):
    """tests/django/retry_settings.py: MAX_ATTEMPTS 2 and a short backoff, for the web side (here)
    and the worker alike."""
    from orders.tasks import charge

    with override_settings(TASKS={"default": {"BACKEND": "skiplock.contrib.django.SkiplockBackend",
                                              "QUEUES": ["default", "emails"],
                                              "OPTIONS": {"MAX_ATTEMPTS": 2, "RETRY_BASE": 0.1, "RETRY_CAP": 0.2}}}):
        result = charge.enqueue(4, 5000)
        assert harness.scalar(shop, "SELECT max_attempts FROM skiplock.tasks") == 2
        django_worker(settings="tests.django.retry_settings")
        finished(result)
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 2, 2)


def test_django_connections_are_closed_after_each_task(shop, django_worker, django_project):
    """CONN_MAX_AGE = 0 (Django's default): the connection a task's ORM opened is closed when it ends."""
    from orders.tasks import charge, send_receipt

    named = f"{django_project} application_name=django-task-runs"
    django_worker(DATABASE_URL=named)
    results = [send_receipt.enqueue(i) for i in range(5)] + [charge.enqueue(i, 1) for i in range(5)]
    for r in results:
        assert finished(r).status == TaskResultStatus.SUCCESSFUL
    harness.wait_for(lambda: harness.scalar(shop, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                            "'django-task-runs'") == 0, 30, message="no Django connection left open")


def test_manage_py_skiplock_worker_runs_the_tasks_on_the_database_of_the_settings(shop, django_project):
    """No SKIPLOCK_DATABASE_URL: the worker takes Django's database, which the backend writes to."""
    from orders.tasks import stock_report

    result = stock_report.enqueue("widget")
    env = harness.child_environment(PYTHONPATH=shop_mod.example_path("django_tasks"), DATABASE_URL=django_project,
                                    SKIPLOCK_METRICS_PORT=str(harness.free_port()))
    worker = subprocess.Popen([sys.executable, "manage.py", "skiplock_worker", "--queues", "default"], cwd=EXAMPLE_DIR,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        finished(result, timeout=120)
        assert result.status == TaskResultStatus.SUCCESSFUL
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
    assert worker.returncode == 0, output[-3000:]


def test_a_worker_with_bad_django_settings_says_why_in_one_line(shop, django_project):
    missing = run_command([sys.executable, "-m", "skiplock.cli", "worker", "--django", "nosuch.settings"],
                          SKIPLOCK_DATABASE_URL=django_project)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "skiplock worker: --django nosuch.settings: ModuleNotFoundError: No module named 'nosuch'"]
    no_backend = run_command([sys.executable, "-m", "skiplock.cli", "worker", "--django", "tests.django.no_tasks_settings"],
                             SKIPLOCK_DATABASE_URL=django_project, DATABASE_URL=django_project)
    assert no_backend.returncode == 1
    assert no_backend.stderr.strip().splitlines() == [
        "skiplock worker: --django tests.django.no_tasks_settings: no TASKS backend is "
        "skiplock.contrib.django.SkiplockBackend"]

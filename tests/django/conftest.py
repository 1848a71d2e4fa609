"""tests/django: skiplock.contrib.django, the backend of Django's task framework, in the example
project examples/django_tasks, on a real Postgres, with real `skiplock worker --django` and
`manage.py skiplock_worker` processes.

Django 6 needs Python >= 3.12: `make test` runs these in .venv-django (`.venv-django/bin/python -m
pytest tests/django`). Under a Django without django.tasks (the 3.11 venv's 5.2) nothing here is
collected.

Django is set up once per test process (its settings are global) on a database of the session,
cloned from the migrated template with the shop's tables; each test starts from an empty queue
and a full stock (the `shop` fixture).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import psycopg
import pytest

from tests.examples import shop as shop_mod
from tests.support import harness

if importlib.util.find_spec("django.tasks") is None:
    collect_ignore_glob = ["test_*.py"]

EXAMPLE = "django_tasks"
EXAMPLE_DIR = shop_mod.EXAMPLES / EXAMPLE
# Django's setup imports a lot; on 2 busy cores a worker may take a while to be ready
READY_SECONDS = 120


@pytest.fixture(scope="session")
def django_project(pg_server_url, template_db):
    """Django set up in this process for the example shop, on a database of this session's."""
    from tests.conftest import clone_database, drop_database

    name, url = clone_database(pg_server_url, template_db)
    with psycopg.connect(url, autocommit=True) as conn:
        shop_mod.create_shop(conn)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    sys.path.insert(0, str(EXAMPLE_DIR))
    import django

    django.setup()
    yield url
    from django.db import connections

    connections.close_all()
    drop_database(pg_server_url, name)


@pytest.fixture
def shop(django_project):
    """An autocommit connection to the project's database: no task, no order, a full stock."""
    with psycopg.connect(django_project, autocommit=True) as conn:
        conn.execute("TRUNCATE skiplock.tasks CASCADE")
        conn.execute("TRUNCATE orders RESTART IDENTITY")
        conn.execute("UPDATE stock SET available = %s", (shop_mod.STOCK,))
        yield conn


@pytest.fixture
def django_worker(processes, django_project):
    """start(settings=..., **env): a real `skiplock worker --django shop.settings`, ready."""
    def start(settings: str = "shop.settings", **env: str):
        proc = processes.spawn(django_project, "--django", settings, "--queues", "default,emails",
                               tasks="", env={"PYTHONPATH": shop_mod.example_path(EXAMPLE),
                                              "DATABASE_URL": django_project, **env})
        processes.wait_ready(proc, timeout=READY_SECONDS)
        return proc
    return start


def run_command(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """argv run to its end in the example's directory; output captured."""
    return shop_mod.run_example(EXAMPLE, argv, **env)


def finished(task_result, timeout: float = 60.0):
    """`task_result` once the worker finished it (refreshed from the database)."""
    def done():
        task_result.refresh()
        return task_result.is_finished
    harness.wait_for(done, timeout, message=f"task {task_result.id} finished")
    return task_result

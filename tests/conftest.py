"""Shared fixtures: a real Postgres, and a fresh database per test cloned from a migrated template.

The server is SKIPLOCK_TEST_DATABASE_URL, else the one on 127.0.0.1:5432, else a throwaway cluster
started for the session (tests/pgcluster.py). Cloning a template takes a few tens of milliseconds,
so every test gets its own isolated database.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import pgcluster  # noqa: E402
from tests.support import harness  # noqa: E402

_counter = itertools.count()


def _with_db(url: str, dbname: str) -> str:
    conninfo = psycopg.conninfo.conninfo_to_dict(url)
    conninfo["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**conninfo)


@pytest.fixture(scope="session")
def pg_server_url():
    url, cluster = pgcluster.ensure_server()
    yield url
    if cluster is not None:
        cluster.cleanup()


@pytest.fixture(scope="session")
def template_db(pg_server_url):
    """A database with every migration applied and the test support tables."""
    name = f"skiplock_tpl_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    url = _with_db(pg_server_url, name)
    from skiplock.engine import migrate

    migrate.apply(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def clone_database(server_url: str, template: str) -> tuple[str, str]:
    name = f"skiplock_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    return name, _with_db(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db_url(pg_server_url, template_db):
    """A fresh, migrated database for this test only."""
    name, url = clone_database(pg_server_url, template_db)
    yield url
    drop_database(pg_server_url, name)


@pytest.fixture
def store(db_url):
    from skiplock.engine.store import Store

    s = Store(db_url, max_size=20).open(wait=True)
    yield s
    s.close()


@pytest.fixture
def db(db_url):
    """An autocommit connection for assertions."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def processes():
    """Starts skiplock processes and makes sure none outlives the test."""
    group = harness.ProcessGroup()
    yield group
    group.kill_all()


@pytest.fixture
def receiver():
    """A webhook receiver: a threaded pytest-httpserver on 127.0.0.1 (a handler that sleeps must
    not hold up the others)."""
    from pytest_httpserver import HTTPServer

    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.clear()
    server.stop()

"""Shared fixtures: a real Postgres, and a fresh database per test cloned from a migrated template.

The server is SKIPLOCK_TEST_DATABASE_URL, else the one on 127.0.0.1:5432, else a throwaway cluster
started for the session (tests/pgcluster.py). Cloning a template takes a few tens of milliseconds,
so every test gets its own isolated database. Under pytest-xdist each worker has its own session:
its own template and databases (both named by its pid), and its own cluster when one is started.

No SKIPLOCK_* variable of the environment the suite was started from reaches a test or a process
it spawns: the suite's own knobs (SUITE_KNOBS) are read first.
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
from tests.support import harness, parallel  # noqa: E402

_counter = itertools.count()

# ---- the environment: no SKIPLOCK_* reaches a test or a process it starts --------------------------

# The suite's own knobs, read by the suite (here; tests/support/sizes.py as it is imported), never by
# skiplock. They stay in the environment while test modules are imported and xdist's workers are
# started (they inherit it), and go when the session starts (below).
SUITE_KNOBS = (pgcluster.ENV_VAR, "SKIPLOCK_RELIABILITY")
_TEST_DATABASE_URL = os.environ.get(pgcluster.ENV_VAR)

# A developer's exported SKIPLOCK_* (a database URL, a lease, a schema): gone before any test module
# is imported.
harness.scrub_environment(os.environ, keep=SUITE_KNOBS)


@pytest.fixture(scope="session", autouse=True)
def _no_skiplock_environment_in_the_session():
    """The knobs go too, before any fixture or test runs: nothing started from here sees one."""
    harness.scrub_environment(os.environ)
    yield


@pytest.fixture(autouse=True)
def _no_skiplock_environment(monkeypatch):
    """Each test starts without SKIPLOCK_* in its environment (it sets what it needs with monkeypatch
    or a spawned process's env); one an earlier test set by hand is removed."""
    for name in [k for k in os.environ if k.startswith(harness.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    yield


# ---- several cores (pytest-xdist): order and scheduling, tests/support/parallel.py ------------------

def pytest_addoption(parser):
    parser.addoption("--write-durations", action="store_true",
                     help="rewrite tests/durations.txt (the order tests start in under xdist) from this run")


def pytest_collection_modifyitems(config, items):
    if getattr(config, "workerinput", None) is not None:  # every worker sorts alike: same collection
        items[:] = parallel.slowest_first(items, parallel.read_durations())


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        return parallel.make_scheduler(config, log)
    return None


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if config.getoption("--write-durations") and getattr(config, "workerinput", None) is None and _measured:
        parallel.write_durations(_measured)


def _with_db(url: str, dbname: str) -> str:
    conninfo = psycopg.conninfo.conninfo_to_dict(url)
    conninfo["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**conninfo)


@pytest.fixture(scope="session")
def pg_server_url():
    url, cluster = pgcluster.ensure_server(_TEST_DATABASE_URL)
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

    s = Store.pooled(db_url, max_size=20).open(wait=True)
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

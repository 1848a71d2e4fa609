"""The distributed tier: skiplock on Citus, a coordinator and two worker nodes on this machine
(tests/support/citus.py). Without Citus (scripts/install-citus builds it) every test here is
skipped with one line saying how to get it; it never passes without having run."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.citus import CitusCluster, citus_missing
from tests.support.harness import SUPPORT_SCHEMA


@pytest.fixture(scope="package")
def citus():
    missing = citus_missing()
    if missing:
        pytest.skip(missing)
    cluster = CitusCluster(nodes=2).start()
    yield cluster
    cluster.cleanup()


@pytest.fixture(scope="module")
def citus_db(citus):
    """The coordinator's database with skiplock migrated (`skiplock migrate`, as a user runs it)
    and the test support tables; an autocommit connection to it."""
    from skiplock.engine import migrate

    migrate.apply(citus.url, "skiplock")
    with psycopg.connect(citus.url, autocommit=True) as conn:
        conn.execute(SUPPORT_SCHEMA)
        yield conn

"""Connections that Postgres ends (pg_terminate_backend): a pooled one ended while idle is
replaced when borrowed, before any statement runs on it; one ended mid-statement surfaces as
ConnectionLost (the roles retry it at once, engine/retry.failures_after). A connection reset
without a word from the server is one too, known by its state: tests/reliability/
test_ambiguous_commit.py."""

from __future__ import annotations

import threading

import pytest

from skiplock.engine.errors import ConnectionLost
from skiplock.engine.store import Store
from tests.support.harness import scalar, wait_for

BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'skiplock-lost'")


@pytest.fixture
def lost(db_url):
    store = Store.pooled(db_url, min_size=2, max_size=2, name="lost").open(wait=True)
    yield store
    store.close()


def _end_all(db) -> list[int]:
    pids = [pid for (pid,) in db.execute(BACKENDS)]
    for pid in pids:
        assert scalar(db, "SELECT pg_terminate_backend(%s)", (pid,)) is True
    wait_for(lambda: not set(pids) & {pid for (pid,) in db.execute(BACKENDS)}, 10, message="the backends gone")
    return pids


def test_a_pooled_connection_ended_while_idle_is_replaced_before_use(lost, db):
    ended = _end_all(db)
    assert len(ended) == 2
    for _ in range(4):  # every connection the pool held was ended: none reaches a caller
        with lost.connection() as conn:
            assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] not in ended
    assert lost.db.pool_stats()["lost"]["exhausted"] == 0


def test_a_connection_ended_mid_statement_is_connection_lost(lost, db):
    raised = []

    def sleep() -> None:
        try:
            with lost.connection() as conn:
                conn.execute("SELECT pg_sleep(30)")
        except Exception as exc:  # the assertion is below, on the main thread
            raised.append(exc)

    sleeper = threading.Thread(target=sleep)
    sleeper.start()
    pid = wait_for(lambda: scalar(db, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND query = 'SELECT pg_sleep(30)' AND state = 'active'"), 10,
                   message="the statement running")
    assert scalar(db, "SELECT pg_terminate_backend(%s)", (pid,)) is True
    sleeper.join(10)
    assert len(raised) == 1 and isinstance(raised[0], ConnectionLost), raised
    with lost.connection() as conn:  # the next borrower gets a working connection
        assert conn.execute("SELECT 1").fetchone() == (1,)

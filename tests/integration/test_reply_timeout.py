"""A role's connection that gives up waiting for Postgres (the reply timeout, AnsweringConnection)
has its statement cancelled, not left running: closing the socket alone does not stop a backend
busy with a statement, which kept its row locks and its snapshot (the soak found a worker's
heartbeat doing so at a saturated database: rows locked for minutes, vacuum held back)."""

from __future__ import annotations

import pytest

from skiplock.engine.errors import DatabaseUnavailable
from skiplock.engine.store import Store
from tests.support.harness import scalar, wait_for

SLEEPING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'skiplock-impatient' AND state = 'active'")


def test_a_statement_given_up_on_is_cancelled_on_the_server(db_url, db):
    store = Store.pooled(db_url, min_size=1, max_size=1, name="impatient", reply_timeout=0.5).open(wait=True)
    try:
        with pytest.raises(DatabaseUnavailable, match="did not answer within 0.5 s"):
            with store.connection() as conn:
                # a row lock held by the statement, as a heartbeat or a settle holds them
                conn.execute("SELECT pg_sleep(60)")
        wait_for(lambda: scalar(db, SLEEPING) == 0, 10, interval=0.1, message="the statement to end on the server")
    finally:
        store.close()

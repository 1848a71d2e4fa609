"""API reads run under SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS: a read that runs longer (here: one
waiting on a lock another session holds) answers 503 database.statement_timeout, and the next
read, once the database is free again, answers normally."""

from __future__ import annotations

import psycopg
import pytest

from skiplock.engine.errors import ConfigError
from skiplock.engine.settings import Settings
from tests.integration.test_api import api, error_of, make_api  # noqa: F401 (fixtures)


@pytest.mark.parametrize("path", ["/v1/tasks", "/v1/queues", "/v1/tasks?queue=nowhere"])
def test_a_read_past_the_statement_timeout_is_a_503_with_its_code(make_api, db_url, path):
    api = make_api(api_statement_timeout_seconds=0.3)
    assert api.get(path).status_code == 200
    with psycopg.connect(db_url) as blocker:
        blocker.execute("LOCK TABLE skiplock.tasks IN ACCESS EXCLUSIVE MODE")
        status, code, message = error_of(api.get(path))
        assert (status, code) == (503, "database.statement_timeout")
        assert "statement timeout" in message
    assert api.get(path).status_code == 200  # the pool's connection is usable again


def test_the_api_pool_carries_the_timeout(make_api):
    api = make_api(api_statement_timeout_seconds=2.5)
    from skiplock.api.app_state import KEY

    with api.app.extensions[KEY].store.connection() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "2500ms"


def test_the_default_is_five_seconds_and_the_variable_sets_it():
    assert Settings.from_env({}).api_statement_timeout_seconds == 5.0
    assert Settings.from_env({"SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS": "0.5"}).api_statement_timeout_seconds == 0.5
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match="SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS"):
            Settings.from_env({"SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS": bad})

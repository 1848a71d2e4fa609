"""Names are matched whole: `$` with re.match admitted a trailing newline, so "q1\n" became a
queue name. Every entry point that takes a name refuses it."""

from __future__ import annotations

import pytest

import skiplock
from skiplock.engine.errors import ConfigError, InvalidInput
from skiplock.engine.schedules import Schedule
from skiplock.engine.settings import Settings, check_name

NEWLINE_NAMES = ["q1\n", "q1\r\n", "\nq1", "q1\nq2"]


@pytest.mark.parametrize("name", NEWLINE_NAMES)
def test_check_name_refuses_a_name_with_a_newline(name):
    with pytest.raises(InvalidInput):
        check_name("queue", name)
    with pytest.raises(ConfigError, match="SKIPLOCK_QUEUES"):
        check_name("queue", name, "SKIPLOCK_QUEUES")


@pytest.mark.parametrize("name", NEWLINE_NAMES)
def test_enqueue_and_schedules_refuse_a_name_with_a_newline(name):
    with pytest.raises(InvalidInput):
        skiplock.enqueue("postgresql://nowhere.invalid/db", "t.noop", {}, queue=name)
    for field in ("name", "kind", "queue"):
        with pytest.raises(InvalidInput, match=field):
            Schedule(**{"name": "s", "kind": "k", "queue": "default", "interval_seconds": 60, field: name})


def test_a_schema_name_with_a_trailing_newline_is_refused():
    with pytest.raises(ConfigError, match="SKIPLOCK_DB_SCHEMA"):
        Settings(db_schema="skiplock\n")

"""engine/outage.py on its own: many failures of many paths make one line, a reminder comes only
after the reminder period, the first answer makes one line, and the pools' warnings fold in."""

from __future__ import annotations

import logging
import time

from skiplock.engine import outage as outage_mod
from skiplock.engine.outage import Outage, PoolWarnings


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "skiplock.database"]


def test_failures_make_one_line_a_reminder_and_one_line_back(caplog):
    caplog.set_level(logging.INFO)
    outage = Outage(remind_seconds=0.2, settle_seconds=0.1)
    outage.held = lambda: {"claims": 3}
    outage.answered()  # nothing wrong: nothing said
    for where in ("claim", "heartbeat", "listener", "pool") * 50:
        outage.failed(where, "connection refused")
    assert lines(caplog) == ["database unreachable; retrying"]
    assert caplog.records[-1].claims == 3 and caplog.records[-1].where == "claim"
    time.sleep(0.25)
    outage.failed("claim", "connection refused")
    outage.failed("claim", "connection refused")
    assert lines(caplog) == ["database unreachable; retrying", "database still unreachable"]
    assert caplog.records[-1].failed_attempts == 201
    outage.answered()
    outage.answered()  # the first answer starts the settle period: nothing said yet
    assert len(lines(caplog)) == 2 and outage.active
    time.sleep(0.12)
    outage.answered()
    assert lines(caplog)[-1] == "database reachable again" and len(lines(caplog)) == 3
    assert caplog.records[-1].failed_attempts == 202
    assert not outage.active


def test_a_flapping_database_is_one_outage_and_the_hook_runs_at_each_first_answer(caplog):
    """A server going down answers one statement in flight; one coming back fails the pools' dead
    idle connections one by one. Neither is the end of the outage, or a new one: the CI log of
    a restart once said away, back, away, back."""
    caplog.set_level(logging.INFO)
    outage = Outage(settle_seconds=0.2)
    backs = []
    outage.on_back = lambda: backs.append(time.monotonic())
    outage.failed("heartbeat", "terminating connection due to administrator command")
    outage.answered()  # a claim the server answered on its way down
    outage.failed("claim", "connection refused")
    outage.answered()  # the server is back
    outage.failed("pool", "discarding broken connection")  # an idle connection that died with it
    outage.answered()
    time.sleep(0.1)
    outage.answered()  # within the settle period
    assert lines(caplog) == ["database unreachable; retrying"]
    time.sleep(0.15)
    outage.answered()
    assert lines(caplog) == ["database unreachable; retrying", "database reachable again"]
    assert caplog.records[-1].failed_attempts == 3
    deadline = time.monotonic() + 5
    while len(backs) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(backs) == 3  # once per first answer after a failure, each in a thread
    outage.answered()
    assert len(lines(caplog)) == 2 and not outage.active


def test_the_pools_warnings_become_the_outages(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    fresh = Outage()
    monkeypatch.setattr(outage_mod, "OUTAGE", fresh)
    record = logging.LogRecord("psycopg.pool", logging.WARNING, "", 0, "error connecting in 'skiplock'", None, None)
    assert PoolWarnings().filter(record) is False and fresh.active
    error = logging.LogRecord("psycopg.pool", logging.ERROR, "", 0, "a bug", None, None)
    assert PoolWarnings().filter(error) is True

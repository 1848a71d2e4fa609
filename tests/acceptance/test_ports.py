"""A role whose port is taken stops at once with one line naming the port and the setting to
change, and exit 1: never a traceback, never a gunicorn retry loop."""

from __future__ import annotations

import socket

import pytest

from tests.acceptance.test_cli import skiplock
from tests.integration.test_api import TOKEN_CONFIG


@pytest.fixture
def taken_port():
    """A port on 127.0.0.1 that another process (this test) listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def only_line(done) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("role, env", [
    ("worker", {"SKIPLOCK_TASKS": "tests.support.handlers"}),
    ("scheduler", {}),
    ("dispatcher", {}),
])
def test_a_taken_metrics_port_stops_the_role_with_one_line(db_url, taken_port, role, env):
    done = skiplock(role, url=db_url, SKIPLOCK_METRICS_PORT=str(taken_port), **env)
    assert only_line(done) == (
        f"skiplock {role}: SKIPLOCK_METRICS_PORT={taken_port}: port {taken_port} is in use (another process "
        f"listens on 0.0.0.0:{taken_port}); set SKIPLOCK_METRICS_PORT to a free port (0: any free one)")


def test_a_taken_api_port_stops_the_api_with_one_line(db_url, taken_port):
    done = skiplock("api", "--bind", f"127.0.0.1:{taken_port}", "--workers", "1", url=db_url,
                    SKIPLOCK_API_TOKENS=TOKEN_CONFIG)
    assert only_line(done) == (
        f"skiplock api: --bind 127.0.0.1:{taken_port}: port {taken_port} is in use (another process listens "
        f"on 127.0.0.1:{taken_port}); pick a free port with --bind HOST:PORT")


@pytest.mark.parametrize("bind, fragment", [
    ("127.0.0.1:http", "'http' is not a valid port number"),
    ("no-such-host.invalid:8080", "cannot listen on no-such-host.invalid:8080"),
])
def test_a_bad_bind_is_one_line(db_url, bind, fragment):
    done = skiplock("api", "--bind", bind, url=db_url, SKIPLOCK_API_TOKENS=TOKEN_CONFIG)
    line = only_line(done)
    assert line.startswith(f"skiplock api: --bind {bind}: ") and fragment in line, line


@pytest.mark.parametrize("variable", ["SKIPLOCK_METRICS_PORT", "SKIPLOCK_DEV_API_PORT"])
def test_a_taken_port_stops_dev_with_one_line(db_url, db, taken_port, variable):
    ports = {"SKIPLOCK_METRICS_PORT": "0", "SKIPLOCK_DEV_API_PORT": "0", variable: str(taken_port)}
    done = skiplock("dev", "--no-demo", url=db_url, **ports)
    line = only_line(done)
    assert line.startswith(f"skiplock dev: {variable}={taken_port}: ") and f"port {taken_port}" in line, line
    # stopped before it ran anything: no schedule, no task, no connection left behind
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND pid <> pg_backend_pid()").fetchone()[0] == 0


def test_a_scheduler_with_a_taken_port_applies_no_schedules_file(db_url, db, taken_port, tmp_path):
    """The port is claimed before the database is touched: a scheduler that cannot serve its
    probes does not half-start by syncing its schedules file first."""
    schedules = tmp_path / "schedules.yaml"
    schedules.write_text("schedules:\n  - name: ports.every-minute\n    kind: t.noop\n    interval_seconds: 60\n")
    done = skiplock("scheduler", url=db_url, SKIPLOCK_METRICS_PORT=str(taken_port),
                    SKIPLOCK_SCHEDULES_FILE=str(schedules))
    assert "SKIPLOCK_METRICS_PORT" in only_line(done)
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0

"""A malformed database URL (issue 37): every role and every `skiplock` command that reads one
exits 1 with one line on stderr naming the variable, never a traceback, and never shows the
password, whichever libpq parse error it is. Real `skiplock` processes."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from tests.support import harness

PASSWORD = "Hunter2xyzzy"

# each a different libpq parse error, with the password where a user would have put it
MALFORMED = {
    "bad_escape": f"postgresql://alice:{PASSWORD}@127.0.0.1:5432/db%zz",
    "bad_escape_in_the_password": f"postgresql://alice:{PASSWORD}%zz@127.0.0.1:5432/db",
    "unclosed_bracket": f"postgresql://alice:{PASSWORD}@[::1:5432/db",
    "space": f"postgresql://alice:{PASSWORD}@127.0.0.1 5432/db",
    "no_equals": f"host=127.0.0.1 password={PASSWORD} dbname",
    "password_in_the_query": f"postgresql://127.0.0.1/db?password={PASSWORD}&sslmode=%zz",
}

# the roles, and a command of each group that reads the database
COMMANDS = [
    ["worker"], ["scheduler"], ["dispatcher"], ["api"], ["dev", "--no-demo"], ["migrate"], ["migrate", "--check"],
    ["enqueue", "some.kind"], ["tasks", "list"], ["tasks", "show", "00000000-0000-0000-0000-000000000000"],
    ["queues", "list"], ["kinds", "pause", "some.kind"], ["audit", "list"], ["limits", "list"],
    ["schedules", "list"], ["workers", "list"], ["webhooks", "list"], ["deliveries", "list"],
]


def run(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skiplock.cli", *args],
                          env=harness.child_environment(SKIPLOCK_METRICS_PORT=harness.free_port(), **env),
                          cwd=harness.ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def assert_one_line_without_the_password(done: subprocess.CompletedProcess, args: list[str], variable: str):
    shown = done.stdout + done.stderr
    assert done.returncode == 1, (args, done.returncode, shown[-2000:])
    assert PASSWORD not in shown, (args, shown[-2000:])
    assert "Traceback" not in shown, (args, shown[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, (args, done.stderr[-2000:])
    assert lines[0].startswith(f"skiplock {args[0]}: {variable}: not a valid libpq URL"), lines[0]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_malformed_database_url_is_one_line_without_its_password(args):
    for url in MALFORMED.values():
        assert_one_line_without_the_password(run(args, SKIPLOCK_DATABASE_URL=url), args, "SKIPLOCK_DATABASE_URL")


@pytest.mark.parametrize("variable,args", [("SKIPLOCK_LISTEN_DATABASE_URL", ["worker"]),
                                           ("SKIPLOCK_READ_DATABASE_URL", ["api"])])
def test_a_malformed_second_url_is_one_line_without_its_password(variable, args, db_url):
    for url in MALFORMED.values():
        done = run(args, SKIPLOCK_DATABASE_URL=db_url, **{variable: url})
        assert_one_line_without_the_password(done, args, variable)


# the admin commands that open a store (issue 35): each said nothing for 16 s, then a traceback
ADMIN = [["tasks", "list"], ["queues", "list"], ["webhooks", "list"], ["schedules", "list"], ["limits", "list"],
         ["workers", "list"], ["deliveries", "list"], ["audit", "list"], ["schedules", "fire", "nightly"]]


@pytest.mark.parametrize("args", ADMIN, ids=" ".join)
def test_an_unreachable_database_is_one_line_at_once(args, pg_server_url):
    import time

    refused = f"postgresql://postgres@127.0.0.1:{harness.free_port()}/postgres"
    missing = psycopg.conninfo.make_conninfo(pg_server_url, dbname="skiplock_no_such_db")
    for url, says in ((refused, "cannot connect to Postgres"), (missing, "skiplock_no_such_db")):
        start = time.monotonic()
        done = run(args, SKIPLOCK_DATABASE_URL=url)
        took = time.monotonic() - start
        assert done.returncode == 1, (args, url, done.stderr[-2000:])
        assert "Traceback" not in done.stdout + done.stderr, (args, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"skiplock {args[0]}: ") and says in lines[0], lines
        assert took < 10, (args, url, took)  # a wrong URL answers as soon as Postgres does, not after retries

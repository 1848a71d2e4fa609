"""The `skiplock` command as a user runs it: migrate, enqueue, and refusing an unmigrated database."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import psycopg
import pytest

from tests.conftest import _with_db
from tests.support.harness import ROOT

MIGRATIONS = sorted(p.name for p in (ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def skiplock(*args: str, url: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "SKIPLOCK_DATABASE_URL": url, "SKIPLOCK_METRICS_PORT": "0",
                "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "skiplock.cli", *args], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def empty_db(pg_server_url):
    name = f"skiplock_empty_{os.getpid()}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    yield _with_db(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_worker_refuses_an_unmigrated_database(empty_db):
    done = skiplock("worker", url=empty_db, SKIPLOCK_TASKS="tests.support.handlers")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"skiplock worker: database schema 'skiplock' is not migrated ({len(MIGRATIONS)} pending, "
        "first 0001_core.sql): run `skiplock migrate`"]


def test_two_migrators_at_once_then_check(empty_db):
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(skiplock("migrate", url=empty_db)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0]
    outputs = sorted(r.stdout for r in results)
    applied = "".join(f"applied: {name}\n" for name in MIGRATIONS) + f"{len(MIGRATIONS)} migration(s) applied\n"
    assert outputs == [applied, "up to date\n"]
    check = skiplock("migrate", "--check", url=empty_db)
    assert (check.returncode, check.stdout) == (0, "up to date\n")
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT count(*) FROM skiplock.schema_migrations").fetchone()[0] == len(MIGRATIONS)


def test_migrate_check_exits_1_while_pending(empty_db):
    check = skiplock("migrate", "--check", url=empty_db)
    assert (check.returncode, check.stdout) == (1, "".join(f"pending: {name}\n" for name in MIGRATIONS))
    assert len(MIGRATIONS) >= 3


def test_enqueue_prints_the_id_and_refuses_bad_input(db_url, db):
    done = skiplock("enqueue", "t.noop", "--payload", '{"n": 1}', "--queue", "q1", "--priority", "3",
                    "--idempotency-key", "k", url=db_url)
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    again = skiplock("enqueue", "t.noop", "--idempotency-key", "k", url=db_url)
    assert again.stdout.strip() == task_id
    row = db.execute("SELECT kind, queue, priority, payload FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
    assert row == ("t.noop", "q1", 3, {"n": 1})
    for args, fragment in [
        (("--payload", "{nope"), "--payload is not valid JSON"),
        (("--run-at", "2030-01-01T09:00:00"), "add a UTC offset"),
        (("--queue", "no spaces"), "invalid queue name"),
        (("--max-attempts", "0"), "max_attempts"),
    ]:
        bad = skiplock("enqueue", "t.noop", *args, url=db_url)
        assert bad.returncode == 1 and fragment in bad.stderr and "Traceback" not in bad.stderr
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 1


def test_unreachable_database_is_one_line(empty_db):
    done = skiplock("migrate", url="postgresql://nobody@127.0.0.1:1/none")
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "cannot connect to Postgres" in done.stderr


def test_enqueue_into_an_unmigrated_database_is_one_line(empty_db):
    done = skiplock("enqueue", "t.noop", url=empty_db)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("skiplock enqueue: the skiplock schema is missing")
    assert "run `skiplock migrate`" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bad_payload_limit_is_named(db_url):
    done = skiplock("enqueue", "t.noop", url=db_url, SKIPLOCK_MAX_PAYLOAD_BYTES="lots")
    assert done.returncode == 1
    assert done.stderr.strip() == "skiplock enqueue: SKIPLOCK_MAX_PAYLOAD_BYTES='lots': not an integer"


def test_schedules_pause_resume_delete_from_the_command_line(db_url, db, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text("schedules:\n  - {name: nightly, kind: reports.daily, cron: '30 2 * * *', timezone: Europe/Berlin}\n")
    assert skiplock("schedules", "apply", "-f", str(path), url=db_url).returncode == 0
    # the command line's store has a single connection: pause must not need a second one
    done = skiplock("schedules", "pause", "nightly", url=db_url)
    assert (done.returncode, done.stdout) == (0, "paused: nightly\n")
    assert db.execute("SELECT enabled FROM skiplock.schedules WHERE name = 'nightly'").fetchone() == (False,)
    listed = skiplock("schedules", "list", url=db_url).stdout
    assert "nightly" in listed and "paused" in listed
    assert skiplock("schedules", "resume", "nightly", url=db_url).stdout == "resumed: nightly\n"
    assert db.execute("SELECT enabled FROM skiplock.schedules WHERE name = 'nightly'").fetchone() == (True,)
    missing = skiplock("schedules", "pause", "nope", url=db_url)
    assert (missing.returncode, missing.stderr) == (1, "skiplock schedules: schedule 'nope' not found\n")
    assert skiplock("schedules", "delete", "nightly", url=db_url).stdout == "deleted: nightly\n"
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone() == (0,)


def test_schedules_apply_refuses_a_payload_over_the_enqueue_limit(db_url, db, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text("schedules:\n  - {name: big, kind: k, interval_seconds: 60, payload: {blob: '" + "x" * 200 + "'}}\n")
    for extra in ((), ("--dry-run",)):
        done = skiplock("schedules", "apply", "-f", str(path), *extra, url=db_url, SKIPLOCK_MAX_PAYLOAD_BYTES="100")
        assert done.returncode == 1
        assert done.stderr.startswith("skiplock schedules: schedule 'big': payload is ")
        assert "the limit is 100" in done.stderr and done.stderr.count("\n") == 1
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone() == (0,)

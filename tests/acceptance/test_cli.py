"""The `skiplock` command as a user runs it: migrate, enqueue, refusing an unmigrated database,
--version, `tokens new`, and task modules found in the current directory."""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

import skiplock as skiplock_package
from tests.conftest import _with_db
from tests.support.harness import ROOT, child_environment, scalar, wait_for

MIGRATIONS = sorted(p.name for p in (ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def skiplock(*args: str, url: str, **env) -> subprocess.CompletedProcess:
    full_env = {**child_environment(), "SKIPLOCK_DATABASE_URL": url, "SKIPLOCK_METRICS_PORT": "0",
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


def test_schedules_fire_now_and_its_decisions_from_the_command_line(db_url, db, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text("schedules:\n  - {name: hourly, kind: reports.hourly, interval_seconds: 3600, queue: reports}\n")
    assert skiplock("schedules", "apply", "-f", str(path), url=db_url).returncode == 0
    first = skiplock("schedules", "fire", "hourly", url=db_url)
    assert first.returncode == 0, first.stderr
    fired = re.fullmatch(r"fired: hourly at (\S+Z), task ([0-9a-f-]{36})\n", first.stdout)
    assert fired, first.stdout
    # the same tick again: the same task, nothing new
    again = skiplock("schedules", "fire", "hourly", url=db_url)
    assert again.stdout == f"already fired in this tick: hourly at {fired[1]}, task {fired[2]}\n"
    assert db.execute("SELECT id::text, kind, queue FROM skiplock.tasks").fetchall() == [
        (fired[2], "reports.hourly", "reports")]
    decisions = skiplock("schedules", "fires", "hourly", url=db_url).stdout.splitlines()
    assert decisions[0].split() == ["NOMINAL", "(UTC)", "OUTCOME", "LAG", "(S)", "TASK", "DETAIL"]
    assert len(decisions) == 2
    day, time_of_day, outcome, lag, task, *detail = decisions[1].split()
    assert (f"{day}T{time_of_day}", outcome, task) == (fired[1][:19], "fired", fired[2])
    assert float(lag) >= 0 and " ".join(detail).startswith("fired now by cli:")
    missing = skiplock("schedules", "fire", "nope", url=db_url)
    assert (missing.returncode, missing.stderr) == (1, "skiplock schedules: schedule 'nope' not found\n")
    bad = skiplock("schedules", "fires", "hourly", "--limit", "0", url=db_url)
    assert (bad.returncode, bad.stderr) == (1, "skiplock schedules: --limit 0: must be 1-1000\n")
    audit = db.execute("SELECT actor LIKE 'cli:%', action, target, outcome, detail->>'created' "
                       "FROM skiplock.audit_log ORDER BY id").fetchall()
    assert audit == [(True, "schedule.create", "hourly", "ok", None),  # the apply
                     (True, "schedule.fire", "hourly", "ok", "true"), (True, "schedule.fire", "hourly", "ok", "false"),
                     (True, "schedule.fire", "nope", "schedule.not_found", None)]


def test_schedules_apply_refuses_a_payload_over_the_enqueue_limit(db_url, db, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text("schedules:\n  - {name: big, kind: k, interval_seconds: 60, payload: {blob: '" + "x" * 200 + "'}}\n")
    for extra in ((), ("--dry-run",)):
        done = skiplock("schedules", "apply", "-f", str(path), *extra, url=db_url, SKIPLOCK_MAX_PAYLOAD_BYTES="100")
        assert done.returncode == 1
        assert done.stderr.startswith("skiplock schedules: schedule 'big': payload is ")
        assert "the limit is 100" in done.stderr and done.stderr.count("\n") == 1
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone() == (0,)


def test_version_prints_the_installed_package_version():
    done = skiplock("--version", url="")
    assert (done.returncode, done.stdout, done.stderr) == \
        (0, f"skiplock {importlib.metadata.version('skiplock')}\n", "")


def test_tokens_new_prints_a_token_and_its_entry():
    done = skiplock("tokens", "new", "--name", "ci", "--role", "submitter", url="")
    assert done.returncode == 0, done.stderr
    match = re.fullmatch(r"token: (skl_[A-Za-z0-9_-]{43})   \(shown once: the client sends `Authorization: Bearer "
                         r"<token>`\)\nentry: (ci:submitter:[0-9a-f]{64})   \(add to SKIPLOCK_API_TOKENS, "
                         r"comma-separated\)\n", done.stdout)
    assert match, done.stdout
    again = skiplock("tokens", "new", "--name", "ci", "--role", "submitter", url="")
    assert again.stdout.split()[1] != match.group(1)  # random each time


@pytest.mark.parametrize("args, code, message", [
    (("--name", "two words", "--role", "reader"), 1,
     "skiplock tokens: invalid token name 'two words': use 1-64 letters, digits, '_', '.', ':' or '-'"),
    (("--name", "ci", "--role", "root"), 2,
     "skiplock tokens new: error: argument --role: invalid choice: 'root' (choose from reader, submitter, admin)"),
])
def test_tokens_new_refuses_a_bad_name_or_role(args, code, message):
    done = skiplock("tokens", "new", *args, url="")
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr.strip().splitlines()[-1].replace("'reader', 'submitter', 'admin'",
                                                        "reader, submitter, admin") == message
    assert "Traceback" not in done.stderr


# ---- task modules in the current directory, as `skiplock` (the console script) finds them ---------------

SCRIPT = Path(sys.executable).with_name("skiplock")

GREET = """from skiplock import task


@task("myapp.greet")
def greet(ctx, payload):
    return {"greeting": "hello " + payload["name"]}
"""


def user_project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def user_env(url: str, **env) -> dict:
    """A user's shell: no SKIPLOCK_* or PYTHONPATH from the test run, only what they set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "PYTHONPATH"}
    return {**clean, "SKIPLOCK_DATABASE_URL": url, "SKIPLOCK_METRICS_PORT": "0", "SKIPLOCK_LOG_FORMAT": "json",
            **env}


def test_the_worker_imports_task_modules_from_the_current_directory(db_url, db, tmp_path):
    assert SCRIPT.exists(), f"{SCRIPT} is missing: install the package (make test)"
    project = user_project(tmp_path, {"myapp/__init__.py": "", "myapp/tasks.py": GREET})
    task_id = skiplock_package.enqueue(db_url, "myapp.greet", {"name": "cwd"})
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([str(SCRIPT), "worker", "--tasks", "myapp.tasks"], cwd=project,
                                  env=user_env(db_url), stdout=out, stderr=subprocess.STDOUT)
    try:
        def completed():
            if worker.poll() is not None:
                raise AssertionError(f"the worker exited ({worker.returncode}):\n{log.read_text()[-3000:]}")
            return scalar(db, "SELECT state = 'completed' FROM skiplock.tasks WHERE id = %s", (task_id,))

        wait_for(completed, 30, message="myapp.greet completed")
        assert scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (task_id,)) == {"greeting": "hello cwd"}
        assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state <> 'completed'") == 0
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


@pytest.mark.parametrize("files, module, message", [
    ({}, "myapp.tasks",
     "SKIPLOCK_TASKS: cannot import 'myapp.tasks': no module 'myapp' in the current directory ({cwd}) "
     "or the installed packages"),
    ({"myapp/__init__.py": "", "myapp/tasks.py": "import not_installed_anywhere\n"}, "myapp.tasks",
     "SKIPLOCK_TASKS: cannot import 'myapp.tasks': ModuleNotFoundError: No module named "
     "'not_installed_anywhere' ({cwd}/myapp/tasks.py:1)"),
    ({"jobs.py": "X = 1\n\nY = undefined_name\n"}, "jobs",
     "SKIPLOCK_TASKS: cannot import 'jobs': NameError: name 'undefined_name' is not defined ({cwd}/jobs.py:3)"),
    ({"jobs.py": "def broken(:\n"}, "jobs",
     "SKIPLOCK_TASKS: cannot import 'jobs': SyntaxError: invalid syntax ({cwd}/jobs.py:1)"),
])
def test_a_task_module_that_cannot_be_imported_is_one_line_naming_it(db_url, tmp_path, files, module, message):
    project = user_project(tmp_path, files)
    done = subprocess.run([str(SCRIPT), "worker"], cwd=project, env=user_env(db_url, SKIPLOCK_TASKS=module),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert done.stderr == f"skiplock worker: {message.format(cwd=project)}\n"
    assert "Traceback" not in done.stdout


def test_schedules_add_creates_one_schedule_audited_and_refuses_a_name_in_use(db_url):
    """`skiplock schedules add` (issue 35): a one-liner for what a file and `schedules apply` did."""
    made = skiplock("schedules", "add", "nightly", "--kind", "reports.nightly", "--cron", "0 3 * * *",
                    "--payload", '{"full": true}', "--queue", "reports", url=db_url)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("created: nightly")
    every = skiplock("schedules", "add", "tick", "--kind", "t.tick", "--every", "30", url=db_url)
    assert every.returncode == 0, every.stderr
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT name, kind, queue, payload, cron, interval_seconds FROM skiplock.schedules "
                            "ORDER BY name").fetchall()
        assert rows == [("nightly", "reports.nightly", "reports", {"full": True}, "0 3 * * *", None),
                        ("tick", "t.tick", "default", {}, None, 30.0)]
        again = skiplock("schedules", "add", "nightly", "--kind", "other.kind", "--cron", "* * * * *", url=db_url)
        assert again.returncode == 1 and again.stderr.strip().count("\n") == 0, again.stderr
        assert "exists" in again.stderr
        assert conn.execute("SELECT kind FROM skiplock.schedules WHERE name = 'nightly'").fetchone() == ("reports.nightly",)
        for bad in (["--cron", "61 * * * *"], ["--cron", "* * * * *", "--payload", "[1"], ["--every", "-5"]):
            refused = skiplock("schedules", "add", "bad", "--kind", "k", *bad, url=db_url)
            assert refused.returncode != 0 and refused.stderr.strip().count("\n") == 0, (bad, refused.stderr)
        assert scalar(conn, "SELECT count(*) FROM skiplock.schedules") == 2
        audit = conn.execute("SELECT action, target, outcome FROM skiplock.audit_log WHERE target IN "
                             "('nightly', 'tick') ORDER BY id").fetchall()
        assert audit == [("schedule.create", "nightly", "ok"), ("schedule.create", "tick", "ok"),
                         ("schedule.create", "nightly", "request.invalid")], audit

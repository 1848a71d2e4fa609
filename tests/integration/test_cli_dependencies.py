"""`skiplock enqueue --depends-on/--on-parent-failure`, `skiplock tasks show` with a task's parents
and children, and `skiplock tasks wait` on real Postgres: what each prints and writes, bad input as
one line on stderr naming the option, exit code 1, with nothing written, and a wait that ends when
another thread settles the task (exit 0) or at its timeout (exit 1). Run through the command's
main() in this process, and once as a real `skiplock` process."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from tests.acceptance.test_cli import skiplock
from tests.integration.test_api_dependencies import complete
from tests.integration.test_cli_limits import run  # noqa: F401 (fixture)

TASKS = "SELECT count(*) FROM skiplock.tasks"
EDGES = "SELECT count(*) FROM skiplock.task_dependencies"


def enqueued(run, *args: str) -> str:
    code, out, err = run("enqueue", *args)
    assert (code, err) == (0, ""), err
    return out.strip()


def test_enqueue_with_parents_and_show_them(run, db):
    a, b = enqueued(run, "export"), enqueued(run, "export")
    report = enqueued(run, "report", "--depends-on", a, "--depends-on", b, "--on-parent-failure", "run")
    assert db.execute("SELECT state, waiting_on, on_parent_failure FROM skiplock.tasks WHERE id = %s",
                      (report,)).fetchone() == ("waiting", 2, "run")
    assert db.execute("SELECT parent_id::text FROM skiplock.task_dependencies WHERE task_id = %s ORDER BY 1",
                      (report,)).fetchall() == sorted([(a,), (b,)])

    code, out, err = run("tasks", "show", report)
    assert (code, err) == (0, "")
    rows = [line.split() for line in out.splitlines()]
    parents = [r[-1] for r in rows[rows.index(["parents", sorted([a, b])[0]]):][:2]]
    assert parents == sorted([a, b])
    assert ["state", "waiting"] in rows and ["waiting_on", "2"] in rows and ["children", "-"] in rows
    shown = json.loads(run("tasks", "show", a, "-o", "json")[1])
    assert (shown["children"], shown["parents"], shown["children_truncated"]) == ([report], [], False)


@pytest.mark.parametrize("args,message", [
    (("--depends-on", "nope"), "skiplock enqueue: --depends-on: 'nope' is not a task id\n"),
    (("--depends-on", "00000000-0000-0000-0000-000000000001"),
     "skiplock enqueue: --depends-on: no task 00000000-0000-0000-0000-000000000001 (in schema skiplock)\n"),
    (("--on-parent-failure", "maybe"), "skiplock enqueue: --on-parent-failure 'maybe': must be 'cancel' or 'run'\n"),
])
def test_bad_dependencies_are_one_line_and_enqueue_nothing(run, db, args, message):
    assert run("enqueue", "report", *args) == (1, "", message)
    assert (db.execute(TASKS).fetchone()[0], db.execute(EDGES).fetchone()[0]) == (0, 0)


def test_tasks_wait_prints_the_task_once_another_thread_completes_it(run, store):
    task_id = enqueued(run, "k")
    worker = threading.Timer(0.5, complete, (store, task_id, {"rows": 3}))
    worker.start()
    started = time.monotonic()
    code, out, err = run("tasks", "wait", task_id, "--timeout", "10", "-o", "json")
    worker.join()
    body = json.loads(out)
    assert (code, err, body["state"], body["result"]) == (0, "", "completed", {"rows": 3})
    assert time.monotonic() - started < 5


def test_tasks_wait_times_out_in_one_line_and_refuses_bad_input(run):
    task_id = enqueued(run, "k")
    started = time.monotonic()
    assert run("tasks", "wait", task_id, "--timeout", "0.5") == \
        (1, "", f"skiplock tasks: task {task_id} is still queued after 0.5 s\n")
    assert time.monotonic() - started < 3
    assert run("tasks", "wait", task_id, "--timeout", "soon") == \
        (1, "", "skiplock tasks: --timeout 'soon': must be a number\n")
    assert run("tasks", "wait", "nope") == (1, "", "skiplock tasks: id 'nope': not a UUID\n")
    missing = uuid.uuid4()
    assert run("tasks", "wait", str(missing), "--timeout", "1") == \
        (1, "", f"skiplock tasks: task {missing} not found\n")


def test_a_real_process_enqueues_a_dependent_and_waits_for_a_final_task(db_url, db):
    parent = skiplock("enqueue", "export", url=db_url).stdout.strip()
    done = skiplock("enqueue", "report", "--depends-on", parent, url=db_url)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    child = done.stdout.strip()
    db.execute("UPDATE skiplock.tasks SET state = 'cancelled', finished_at = now() WHERE id = %s", (parent,))
    # the parent's cancel cancelled its dependent (on_parent_failure cancel): both are final
    waited = skiplock("tasks", "wait", child, "--timeout", "5", url=db_url)
    assert (waited.returncode, waited.stderr) == (0, ""), waited.stderr
    assert ["state", "cancelled"] in [line.split() for line in waited.stdout.splitlines()]

"""The operator's commands as a user runs them (real `skiplock` processes, real Postgres):
`tasks list` tables and JSON over seeded tasks, a bulk retry that changes exactly the failed
tasks with one audit row naming cli:<user> (and nothing on a repeat), single-task cancel and
resume, queues and kinds pausing, `audit list`, and bad input as a one-line error."""

from __future__ import annotations

import getpass
import json

import psycopg
import pytest

from tests.acceptance.test_cli import skiplock

ACTOR = f"cli:{getpass.getuser()}"


@pytest.fixture
def db(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


def seed(db, state: str, n: int, *, queue: str = "default", kind: str = "k") -> list:
    finished = "now()" if state in ("completed", "failed", "cancelled") else "NULL"
    return [r[0] for r in db.execute(
        f"INSERT INTO skiplock.tasks (id, kind, queue, state, attempts, finished_at, event_seq, last_error) "
        f"SELECT skiplock.uuid7(), %s, %s, %s, 1, {finished}, 1, 'boom' FROM generate_series(1, %s) RETURNING id",
        (kind, queue, state, n)).fetchall()]


def ok(*args: str, url: str) -> str:
    done = skiplock(*args, url=url)
    assert (done.returncode, done.stderr) == (0, ""), (args, done.stderr)
    return done.stdout


def test_list_tables_and_json_count_the_seeded_tasks(db, db_url):
    seed(db, "failed", 4)
    seed(db, "queued", 3, queue="mail", kind="send")

    table = ok("tasks", "list", url=db_url).splitlines()
    assert table[0].split()[:4] == ["ID", "KIND", "QUEUE", "STATE"]
    assert len(table) == 1 + 7
    failed_rows = ok("tasks", "list", "--state", "failed", url=db_url).splitlines()[1:]
    assert len(failed_rows) == 4 and all(r.split()[3] == "failed" for r in failed_rows)

    page = json.loads(ok("tasks", "list", "--queue", "mail", "-o", "json", url=db_url))
    assert len(page["tasks"]) == 3 and {t["kind"] for t in page["tasks"]} == {"send"}
    first = json.loads(ok("tasks", "list", "--limit", "5", "-o", "json", url=db_url))
    rest = json.loads(ok("tasks", "list", "--limit", "5", "--cursor", first["next_cursor"], "-o", "json", url=db_url))
    assert (len(first["tasks"]), len(rest["tasks"]), rest["next_cursor"]) == (5, 2, None)

    task_id = page["tasks"][0]["id"]
    assert json.loads(ok("tasks", "show", task_id, "-o", "json", url=db_url))["id"] == task_id
    events = json.loads(ok("tasks", "events", task_id, "-o", "json", url=db_url))["events"]
    assert [e["type"] for e in events] == ["queued"]
    assert ok("tasks", "list", "--id", task_id, url=db_url).count(task_id) == 1


def test_bulk_retry_changes_exactly_the_failed_tasks_once_with_one_audit_row(db, db_url):
    failed = seed(db, "failed", 12)
    seed(db, "completed", 5)
    seed(db, "failed", 3, queue="other")

    out = ok("tasks", "retry", "--all", "--queue", "default", "--state", "failed", url=db_url)
    assert out == "retried: 12 tasks\n"
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'queued'",
                      (failed,)).fetchone()[0] == 12
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'failed'").fetchone()[0] == 3
    assert db.execute("SELECT count(*) FROM skiplock.task_events WHERE type = 'resumed' AND data->>'by' = %s",
                      (ACTOR,)).fetchone()[0] == 12
    again = json.loads(ok("tasks", "retry", "--all", "--queue", "default", "--state", "failed", "-o", "json",
                          url=db_url))
    assert again == {"changed": 0, "limit": 1000}
    rows = db.execute("SELECT actor, action, detail->>'changed' FROM skiplock.audit_log ORDER BY id").fetchall()
    assert rows == [(ACTOR, "task.retry_many", "12"), (ACTOR, "task.retry_many", "0")]

    listed = json.loads(ok("audit", "list", "--action", "task.retry_many", "-o", "json", url=db_url))["entries"]
    assert [e["detail"]["changed"] for e in listed] == [0, 12]


def test_single_cancel_resume_and_pausing(db, db_url):
    [task_id] = seed(db, "queued", 1)
    assert ok("tasks", "cancel", str(task_id), "--reason", "not needed", url=db_url) == f"cancelled: {task_id}\n"
    assert json.loads(ok("tasks", "resume", str(task_id), "-o", "json", url=db_url))["state"] == "queued"
    assert ok("queues", "pause", "default", url=db_url) == "paused: default\n"
    assert ok("kinds", "pause", "k", url=db_url) == "paused: k\n"
    overview = json.loads(ok("queues", "list", "-o", "json", url=db_url))
    assert overview["paused_kinds"] == ["k"]
    assert [(q["name"], q["tasks"]["queued"], q["paused"]) for q in overview["queues"]] == [("default", 1, True)]
    assert "paused kinds: k" in ok("queues", "list", url=db_url)
    ok("queues", "resume", "default", url=db_url)
    refused = skiplock("tasks", "resume", str(task_id), url=db_url)
    assert (refused.returncode, refused.stderr.count("\n")) == (1, 1) and "only failed or cancelled" in refused.stderr
    assert db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log ORDER BY id").fetchall() == [
        (ACTOR, "task.cancel", str(task_id), "ok"), (ACTOR, "task.resume", str(task_id), "ok"),
        (ACTOR, "queue.pause", "default", "ok"), (ACTOR, "kind.pause", "k", "ok"),
        (ACTOR, "queue.resume", "default", "ok"), (ACTOR, "task.resume", str(task_id), "task.not_resumable")]


@pytest.mark.parametrize("args, words", [
    (("tasks", "list", "--state", "bogus"), "--state"),
    (("tasks", "list", "--created-after", "yesterday"), "--created-after"),
    (("tasks", "list", "--limit", "0"), "--limit"),
    (("tasks", "retry", "--all"), "needs a filter"),
    (("tasks", "retry", "--all", "--state", "completed"), "retry acts on failed or cancelled"),
    (("tasks", "cancel", "--all", "--state", "queued", "--limit", "0"), "limit 0"),
    (("tasks", "resume"), "give a task id or --all"),
    (("tasks", "show", "not-a-uuid"), "not a UUID"),
    (("audit", "list", "--cursor", "x"), "--cursor"),
])
def test_bad_input_is_one_line(db, db_url, args, words):
    seed(db, "failed", 2)
    done = skiplock(*args, url=db_url)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and words in lines[0], done.stderr
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'failed'").fetchone()[0] == 2


def test_a_bad_command_line_exits_2(db_url):
    done = skiplock("tasks", "list", "-o", "yaml", url=db_url)
    assert done.returncode == 2 and "invalid choice" in done.stderr


# what a submitter's handler can put in last_error, or a refused request in an audit row's target:
# a window-title OSC, a screen clear and a right-to-left override
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202eboom"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\u202eboom"


def test_control_characters_in_task_data_print_escaped(db, db_url):
    (task_id,) = seed(db, "failed", 1)
    db.execute("UPDATE skiplock.tasks SET last_error = %s", (HOSTILE,))
    db.execute("INSERT INTO skiplock.audit_log (actor, action, target, outcome) VALUES ('bot', 'queue.pause', %s, "
               "'request.invalid_input')", (HOSTILE,))
    outputs = {args: ok(*args, url=db_url) for args in (("tasks", "list"), ("tasks", "show", str(task_id)),
                                                        ("audit", "list"))}
    for args, out in outputs.items():
        assert sum(out.count(c) for c in "\x1b\x07\u202e") == 0, args
        assert out.count(SHOWN) == 1, (args, out)
    # JSON was escaped before, and still gives the text back as it was
    assert json.loads(ok("tasks", "show", str(task_id), "-o", "json", url=db_url))["last_error"] == HOSTILE

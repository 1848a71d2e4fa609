"""The rough edges of the operator's commands a new user hit (issue 35, section 3 and its "Low"
list), on real Postgres through the command's main() in this process: every change from the CLI
writes the audit row the API's route writes (actor cli:<os user>); a pause of a name no task has
had is refused without --force; `kinds list`; the webhook and delivery tables with headers,
newest first; `queues list`'s OLDEST as a duration and a paused queue's CLAIMABLE; `tasks show`'s
traceback as lines and a completed task's earlier error labelled."""

from __future__ import annotations

import getpass
import json

import pytest

from skiplock import cli
from tests.integration.test_cli_limits import run  # noqa: F401 - the fixture

ACTOR = f"cli:{getpass.getuser()}"
LOCAL = "127.0.0.0/8"


def audit(db) -> list[tuple]:
    return db.execute("SELECT actor, action, target, outcome, detail FROM skiplock.audit_log ORDER BY id").fetchall()


def seed(db, state: str, *, queue: str = "default", kind: str = "k", error: str | None = None,
         traceback: str | None = None, age_seconds: float = 0) -> str:
    """A task as the worker leaves it; with `error`, the event that recorded it (and its traceback)."""
    finished = "now()" if state in ("completed", "failed", "cancelled") else "NULL"
    task_id = str(db.execute(
        f"INSERT INTO skiplock.tasks (id, kind, queue, state, attempts, finished_at, event_seq, last_error, "
        f"run_after) VALUES (skiplock.uuid7(), %s, %s, %s, 1, {finished}, 2, %s, "
        "now() - make_interval(secs => %s)) RETURNING id", (kind, queue, state, error, age_seconds)).fetchone()[0])
    if error is not None:
        db.execute("INSERT INTO skiplock.task_events (task_id, seq, type, attempt, data) VALUES "
                   "(%s, 2, 'retrying', 1, jsonb_build_object('error', %s::text, 'traceback', %s::text))",
                   (task_id, error, traceback))
    return task_id


def test_webhook_changes_are_audited_as_the_api_audits_them(run, db, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS", LOCAL)
    code, out, err = run("webhooks", "add", "http://127.0.0.1:9999/hook", "--events", "task.failed")
    assert (code, err) == (0, "")
    endpoint = out.splitlines()[0].removeprefix("id: ")
    assert run("webhooks", "rotate-secret", endpoint)[0] == 0
    assert run("webhooks", "enable", endpoint)[0] == 0
    assert run("deliveries", "redeliver", "--endpoint", endpoint) == (0, "0 deliveries queued again\n", "")
    assert run("webhooks", "remove", endpoint) == (0, f"removed: {endpoint}\n", "")
    code, _, err = run("webhooks", "remove", endpoint)
    assert code == 1 and err.count("\n") == 1 and "not found" in err
    missing = "00000000-0000-0000-0000-000000000000"
    assert run("deliveries", "redeliver", missing)[0] == 1
    rows = audit(db)
    assert [r[:4] for r in rows] == [
        (ACTOR, "webhook.create", endpoint, "ok"), (ACTOR, "webhook.rotate_secret", endpoint, "ok"),
        (ACTOR, "webhook.enable", endpoint, "ok"), (ACTOR, "webhook.redeliver", endpoint, "ok"),
        (ACTOR, "webhook.delete", endpoint, "ok"), (ACTOR, "webhook.delete", endpoint, "webhook.not_found"),
        (ACTOR, "delivery.redeliver", missing, "delivery.not_found")]
    assert rows[0][4] == {"url": "http://127.0.0.1:9999/hook", "events": ["task.failed"]}  # never the secret
    assert rows[3][4] == {"redelivered": 0}


def test_schedule_changes_and_enqueue_are_audited_as_the_api_audits_them(run, db, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text("schedules:\n  - {name: a, kind: k, interval_seconds: 60}\n"
                    "  - {name: b, kind: k, interval_seconds: 60}\n")
    assert run("schedules", "apply", "-f", str(path))[0] == 0
    assert run("schedules", "apply", "-f", str(path))[0] == 0  # unchanged: no rows
    path.write_text("schedules:\n  - {name: a, kind: k, interval_seconds: 30}\n")
    assert run("schedules", "apply", "-f", str(path), "--prune")[0] == 0
    assert run("schedules", "pause", "a") == (0, "paused: a\n", "")
    assert run("schedules", "resume", "a") == (0, "resumed: a\n", "")
    assert run("schedules", "delete", "a") == (0, "deleted: a\n", "")
    assert run("schedules", "delete", "a")[0] == 1
    code, out, _ = run("enqueue", "k", "--idempotency-key", "once")
    task_id = out.strip()
    assert code == 0 and run("enqueue", "k", "--idempotency-key", "once")[0] == 0
    file = {"file": str(path)}
    assert audit(db) == [
        (ACTOR, "schedule.create", "a", "ok", file), (ACTOR, "schedule.create", "b", "ok", file),
        (ACTOR, "schedule.update", "a", "ok", file), (ACTOR, "schedule.delete", "b", "ok", file),
        (ACTOR, "schedule.update", "a", "ok", {"fields": ["enabled"]}),
        (ACTOR, "schedule.update", "a", "ok", {"fields": ["enabled"]}),
        (ACTOR, "schedule.delete", "a", "ok", None),
        (ACTOR, "schedule.delete", "a", "schedule.not_found", {"message": "schedule 'a' not found"}),
        (ACTOR, "task.submit", task_id, "ok", None), (ACTOR, "task.submit", task_id, "ok", {"replayed": True})]


def test_pausing_a_name_no_task_has_had_is_refused_without_force(run, db):
    seed(db, "queued", queue="mail", kind="mail.send")
    seed(db, "queued", queue="default", kind="report.build")
    code, out, err = run("queues", "pause", "nosuch")
    assert (code, out) == (1, "")
    assert err == ("skiplock queues: no task has had the queue 'nosuch' (known: default, mail); "
                   "--force pauses it anyway\n")
    code, _, err = run("kinds", "pause", "nosuch.kind")
    assert code == 1 and "(known: mail.send, report.build)" in err and "--force" in err
    assert db.execute("SELECT count(*) FROM skiplock.pauses").fetchone()[0] == 0 and audit(db) == []
    assert run("queues", "pause", "mail") == (0, "paused: mail\n", "")
    assert run("queues", "pause", "nosuch", "--force") == (0, "paused: nosuch\n", "")
    assert run("queues", "pause", "nosuch") == (0, "paused: nosuch\n", "")  # paused: known
    assert run("queues", "resume", "never.seen") == (0, "resumed: never.seen\n", "")  # a resume changes nothing
    assert run("kinds", "pause", "report.build")[0] == 0

    code, out, _ = run("kinds", "list")
    assert code == 0 and [line.split() for line in out.splitlines()] == [
        ["KIND", "QUEUES", "PAUSED"], ["mail.send", "mail", "no"], ["report.build", "default", "yes"]]


def test_pause_refusal_names_a_few_of_many(run, db):
    for i in range(8):
        seed(db, "queued", queue=f"q{i}")
    err = run("queues", "pause", "nosuch")[2]
    assert "(known: q0, q1, q2, q3, q4 and 3 more)" in err


@pytest.mark.parametrize("path", [("queues",), ("kinds",)])
def test_every_action_has_its_help_line(path, capsys):
    with pytest.raises(SystemExit):
        cli.main([*path, "--help"])
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("    ") and len(line.split()) > 1}
    assert listed == {"list", "pause", "resume"}


def test_webhooks_and_deliveries_list_have_headers_newest_first(run, db, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS", LOCAL)
    assert run("webhooks", "list") == (0, "no webhook endpoints\n", "")
    assert run("deliveries", "list") == (0, "no deliveries\n", "")
    ids = [run("webhooks", "add", f"http://127.0.0.1:9999/{n}")[1].split()[1] for n in ("old", "new")]
    db.execute("UPDATE skiplock.webhook_endpoints SET created_at = now() - interval '1 hour' WHERE id = %s",
               (ids[0],))
    lines = run("webhooks", "list")[1].splitlines()
    assert lines[0].split() == ["ID", "URL", "EVENTS", "STATE", "PENDING", "DEAD", "CREATED", "(UTC)"]
    assert [line.split()[0] for line in lines[1:]] == [ids[1], ids[0]]
    assert lines[1].split()[1:6] == ["http://127.0.0.1:9999/new", "task.*", "enabled", "0", "0"]

    deliveries = [str(r[0]) for r in db.execute(
        "INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload, created_at) "
        "SELECT gen_random_uuid(), %s, 'task.completed', '{}', now() - make_interval(mins => n) "
        "FROM generate_series(1, 3) AS n RETURNING id", (ids[1],)).fetchall()]
    lines = run("deliveries", "list")[1].splitlines()
    assert lines[0].split()[:6] == ["ID", "ENDPOINT", "EVENT", "STATE", "ATTEMPTS", "LAST"]
    assert [line.split()[0] for line in lines[1:]] == deliveries  # 1, 2, 3 minutes old
    assert [line.split()[0] for line in run("deliveries", "list", "--limit", "1")[1].splitlines()[1:]] == \
        deliveries[:1]


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (12.7, "12 s"), (60, "1 min"), (3180.4, "53 min"),
                                           (3185, "53 min 5 s"), (7500, "2 h 5 min"), (90061, "1 d 1 h")])
def test_durations_read_as_a_person_says_them(seconds, text):
    from skiplock.api.render import duration_text

    assert duration_text(seconds) == text


def test_queues_list_oldest_is_a_duration_and_a_paused_queue_claims_nothing(run, db):
    seed(db, "queued", queue="mail", age_seconds=3180.4)
    seed(db, "queued", queue="reports", age_seconds=7510)
    assert run("queues", "pause", "reports")[0] == 0
    lines = run("queues", "list")[1].splitlines()
    header = lines[0].split()
    rows = {line.split()[0]: line for line in lines[1:]}
    oldest = lines[0].index("OLDEST")
    assert rows["mail"][oldest:].split()[0:2] == ["53", "min"]
    assert rows["reports"][oldest:].startswith("2 h 5 min")
    claimable = lines[0].index("CLAIMABLE")
    assert rows["mail"][claimable:].split()[0] == "1"
    assert rows["reports"][claimable:].startswith("0 (paused, 1 ready)")
    assert "CLAIMABLE" in header
    # the JSON is GET /v1/queues' answer, unchanged
    body = json.loads(run("queues", "list", "-o", "json")[1])
    assert [(q["name"], q["claimable"], q["paused"]) for q in body["queues"]] == [("mail", 1, False),
                                                                                   ("reports", 1, True)]
    assert 3180 <= body["queues"][0]["oldest_claimable_age_seconds"] < 3240


TRACE = ('Traceback (most recent call last):\n  File "app/tasks.py", line 12, in count\n    total = n / 0\n'
         "ZeroDivisionError: division by zero\n")


def test_tasks_show_prints_a_traceback_as_its_lines(run, db):
    task_id = seed(db, "failed", error="ZeroDivisionError: division by zero", traceback=TRACE)
    out = run("tasks", "show", task_id)[1]
    table, _, block = out.partition("\ntraceback:\n")
    assert block == "".join(f"  {line}\n" for line in TRACE.splitlines())
    assert "last_error            ZeroDivisionError: division by zero" in table or \
        [line.split(None, 1) for line in table.splitlines() if line.startswith("last_error ")] == \
        [["last_error", "ZeroDivisionError: division by zero"]]
    assert json.loads(run("tasks", "show", task_id, "-o", "json")[1])["last_error_traceback"] == TRACE


def test_a_completed_tasks_earlier_error_is_labelled(run, db):
    task_id = seed(db, "completed", error="TimeoutError: first try", traceback=TRACE)
    out = run("tasks", "show", task_id)[1]
    [row] = [line.split(None, 1) for line in out.splitlines() if line.startswith("last_error ")]
    assert row == ["last_error", "earlier error: TimeoutError: first try"]
    assert "\nearlier traceback:\n" in out
    listed = run("tasks", "list")[1].splitlines()[1]
    assert listed.endswith("earlier error: TimeoutError: first try")
    failed = seed(db, "failed", error="TimeoutError: for good")
    assert run("tasks", "list", "--id", failed)[1].splitlines()[1].endswith("  TimeoutError: for good")
    assert json.loads(run("tasks", "show", task_id, "-o", "json")[1])["last_error"] == "TimeoutError: first try"


def test_the_console_labels_a_completed_tasks_earlier_error(db_url, db):
    from skiplock.api.app import close_app, create_app
    from tests.integration.test_api import api_settings
    from tests.integration.test_console import sign_in

    done = seed(db, "completed", error="TimeoutError: first try")
    failed = seed(db, "failed", error="TimeoutError: for good")
    app = create_app(api_settings(db_url))
    try:
        client = app.test_client()
        sign_in(client, "reader")
        page = client.get(f"/ui/tasks/{done}").text
        assert "<h2>Earlier error</h2>" in page and "the task did not fail" in page
        page = client.get(f"/ui/tasks/{failed}").text
        assert "<h2>Error</h2>" in page and "Earlier error" not in page
    finally:
        close_app(app)

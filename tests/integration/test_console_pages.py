"""The console's pages as people read them, through Flask's test client on a real database (and a
real worker where a task must fail): state tabs with counts, the live workers of each queue (a queue
none claims is marked), a task's events as a timeline with tracebacks as code, deliveries naming
their task and endpoint URL, relative times with the absolute one on hover, empty states that say
how to make the first thing, and creating and editing a schedule with its next five fires shown
before it is saved (audited). The layout at 400 px, the dark theme and axe are the browser's
(tests/acceptance/test_console_layout.py)."""

from __future__ import annotations

import datetime as dt
import html
import re

import skiplock
from skiplock.engine.cron import CronExpression
from skiplock.engine.store.workers import WorkerRecord
from tests.integration.test_api import TOKENS
from tests.integration.test_console import csrf_of, make_app, sign_in  # noqa: F401 (fixtures)
from tests.support.harness import wait_for

ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}


def _tabs(page: str) -> dict[str, int]:
    return {name: int(n) for name, n in re.findall(r'data-tab="(\w+)">\w+<span class="count">(\d+)</span>', page)}


def test_state_tabs_count_every_state_and_follow_the_queue_shown(make_app, db_url, db):
    for queue in ("mail", "mail", "bulk"):
        skiplock.enqueue(db_url, "k", {}, queue=queue)
    cancelled = skiplock.enqueue(db_url, "k", {}, queue="mail")
    client = make_app().test_client()
    assert client.post(f"/v1/tasks/{cancelled}/cancel", headers=ADMIN, json={}).status_code == 200
    sign_in(client, "reader")
    overview = client.get("/ui/").text
    assert _tabs(overview) == {"all": 4, "waiting": 0, "queued": 3, "running": 0, "cancelling": 0, "completed": 0,
                               "failed": 0, "cancelled": 1}
    tasks = client.get("/ui/tasks?queue=mail&state=queued").text
    assert _tabs(tasks)["all"] == 3 and _tabs(tasks)["queued"] == 2
    assert re.search(r'aria-current="true" data-tab="queued"', tasks)
    # each tab keeps the queue shown
    assert 'href="/ui/tasks?queue=mail&amp;state=cancelled" data-tab="cancelled"' in tasks
    assert len(re.findall(r"<tr data-task=", tasks)) == 2


def test_each_queue_shows_its_live_workers_and_a_queue_none_claims_is_marked(make_app, db_url, store):
    skiplock.enqueue(db_url, "k", {}, queue="mail")
    skiplock.enqueue(db_url, "k", {}, queue="orphan")
    for worker_id, queues, slots in (("w1", ["mail", "bulk"], 4), ("w2", ["mail"], 2)):
        store.workers.worker_register(WorkerRecord(worker_id, "host", 1, queues, slots, 0, "test", 30.0))
    client = make_app().test_client()
    sign_in(client, "reader")
    page = client.get("/ui/").text
    mail = re.search(r'<tr data-queue="mail">.*?</tr>', page, re.S).group(0)
    orphan = re.search(r'<tr data-queue="orphan">.*?</tr>', page, re.S).group(0)
    assert ">2 (6 slots)</a>" in mail and "data-unserved" not in mail
    assert "data-unserved" in orphan and "no live worker claims this queue" in orphan
    assert page.count("data-unserved") == 1 and "2 live worker(s)." in page


def test_a_tasks_events_are_a_timeline_and_its_traceback_code(make_app, db_url, db, processes):
    task_id = skiplock.enqueue(db_url, "console.crash", {"text": "x"})
    worker = processes.spawn(db_url, tasks="tests.support.console_handlers")
    processes.wait_ready(worker)
    wait_for(lambda: db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]
             == "failed", 30, message="the task failed")
    client = make_app().test_client()
    sign_in(client, "reader")
    page = client.get(f"/ui/tasks/{task_id}").text
    steps = re.findall(r'<li class="event-(\w+)" data-seq="(\d+)"', page)
    types = [t for t, _ in steps]
    assert types[0] == "queued" and types[-1] == "failed" and [int(s) for _, s in steps] == list(range(1, len(steps) + 1))
    # each event after the first says how long after the one before it came
    assert len(re.findall(r'data-field="since">\+[\d.]+ s</span>', page)) == len(steps) - 1
    # the failed event's traceback and two-line message are code blocks, newlines kept, not JSON strings
    block = re.search(r'<pre class="code" tabindex="0" data-field="event-traceback"><code>(.*?)</code></pre>', page, re.S)
    assert block and "Traceback (most recent call last)" in html.unescape(block.group(1))
    assert block.group(1).count("\n") > 5 and "in parse" in block.group(1) and "&#34;traceback&#34;" not in page
    message = re.search(r'data-field="event-error"><code>(.*?)</code>', page, re.S)
    assert message and "could not read the order\nline two of the message" in html.unescape(message.group(1))
    task_traceback = re.search(r'<pre class="code" tabindex="0" data-field="traceback"><code>(.*?)</code>', page, re.S)
    assert task_traceback and "ValueError" in task_traceback.group(1)


def test_times_are_relative_with_the_absolute_time_on_hover(make_app, db_url, db):
    task_id = skiplock.enqueue(db_url, "k", {})
    db.execute("UPDATE skiplock.tasks SET created_at = now() - interval '53 minutes 10 seconds' WHERE id = %s",
               (task_id,))
    created = db.execute("SELECT created_at FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]
    client = make_app().test_client()
    sign_in(client, "reader")
    row = re.search(r'<tr data-task=.*?</tr>', client.get("/ui/tasks").text, re.S).group(0)
    stamp = re.search(r'<time datetime="([^"]+)" title="([^"]+)" data-relative>([^<]+)</time>', row)
    assert stamp, row
    assert stamp.group(2) == created.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert stamp.group(3) in ("53 min 10 s ago", "53 min 11 s ago", "53 min 12 s ago")


def test_deliveries_name_their_task_and_the_endpoints_url(make_app, db_url):
    app = make_app()
    client = app.test_client()
    made = client.post("/v1/webhooks", headers=ADMIN, json={"url": "https://93.184.216.34/hook", "events": ["task.*"]})
    assert made.status_code == 201, made.text
    task_id = skiplock.enqueue(db_url, "k", {})
    sign_in(client, "admin")
    page = client.get("/ui/deliveries").text
    rows = re.findall(r'<tr data-delivery=.*?</tr>', page, re.S)
    assert len(rows) == 1
    assert f'<a href="/ui/tasks/{task_id}"><code>{task_id}</code></a>' in rows[0]
    assert "<code>https://93.184.216.34/hook</code>" in rows[0]


def test_empty_pages_say_how_to_make_the_first_thing(make_app):
    client = make_app().test_client()
    sign_in(client, "admin")
    expected = {"/ui/": "skiplock enqueue", "/ui/tasks": "skiplock enqueue", "/ui/schedules": "skiplock schedules add",
                "/ui/webhooks": "skiplock webhooks add", "/ui/deliveries": "skiplock webhooks add",
                "/ui/limits": "skiplock limits set", "/ui/workers": "skiplock worker",
                "/ui/signals": "skiplock signals send"}
    for path, command in expected.items():
        page = client.get(path).text
        empty = re.search(r'<td colspan="\d+" class="empty">(.*?)</td>', page, re.S)
        assert empty and command in empty.group(1), path


def _form(client, path="/ui/schedules/new"):
    page = client.get(path)
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


def test_a_schedule_is_checked_with_its_next_five_fires_then_saved_and_audited(make_app, db):
    client = make_app().test_client()
    sign_in(client, "admin")
    assert 'href="/ui/schedules/new">New schedule</a>' in client.get("/ui/schedules").text
    fields = {"csrf": _form(client), "original": "", "name": "nightly", "kind": "reports.daily", "queue": "reports",
              "timing": "cron", "cron": "30 2 * * 1-5", "timezone": "Europe/Berlin", "interval_seconds": "",
              "payload": '{"format": "pdf"}', "step": "check"}
    checked = client.post("/ui/schedules/form", data=fields)
    assert checked.status_code == 200, checked.text
    fires = re.findall(r'<li><time datetime="([^"]+)">', checked.text)
    berlin = __import__("zoneinfo").ZoneInfo("Europe/Berlin")
    expected, at = [], dt.datetime.now(dt.timezone.utc)
    for _ in range(5):
        at = CronExpression.parse("30 2 * * 1-5").next_after(at, berlin)
        expected.append(at)
    assert [dt.datetime.fromisoformat(f.replace("Z", "+00:00")) for f in fires] == expected
    assert 'value="save">Save</button>' in checked.text
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0  # a check writes nothing
    saved = client.post("/ui/schedules/form", data={**fields, "step": "save"})
    assert (saved.status_code, saved.headers["Location"]) == (303, "/ui/schedules?saved=nightly")
    row = db.execute("SELECT kind, queue, cron, timezone, payload FROM skiplock.schedules WHERE name = 'nightly'").fetchone()
    assert row == ("reports.daily", "reports", "30 2 * * 1-5", "Europe/Berlin", {"format": "pdf"})
    # edit: the form starts from the schedule; a switch to an interval clears the cron
    edit = client.get("/ui/schedules/nightly/edit").text
    assert 'value="30 2 * * 1-5"' in edit and 'name="name" value="nightly" required maxlength="64" readonly' in edit
    changed = client.post("/ui/schedules/form", data={**fields, "csrf": csrf_of(edit), "original": "nightly",
                                                      "timing": "every", "interval_seconds": "90", "step": "save"})
    assert changed.status_code == 303, changed.text
    assert db.execute("SELECT cron, interval_seconds FROM skiplock.schedules WHERE name = 'nightly'").fetchone() \
        == (None, 90.0)
    # the same name again is refused on the form, with nothing changed
    again = client.post("/ui/schedules/form", data={**fields, "step": "save"})
    assert again.status_code == 409 and "nightly" in again.text and 'role="alert"' in again.text
    assert db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log ORDER BY id").fetchall() == [
        ("admin-bot", "schedule.create", "nightly", "ok"), ("admin-bot", "schedule.update", "nightly", "ok"),
        ("admin-bot", "schedule.create", "nightly", "schedule.exists")]


def test_a_bad_schedule_is_refused_on_the_form_in_one_line(make_app, db):
    client = make_app().test_client()
    sign_in(client, "admin")
    base = {"csrf": _form(client), "original": "", "name": "n", "kind": "k", "queue": "", "timing": "cron",
            "cron": "61 * * * *", "timezone": "UTC", "interval_seconds": "", "payload": "{}", "step": "check"}
    for changes, words in (({}, "minute"), ({"cron": "0 6 * * *", "timezone": "Mars/Base"}, "Mars/Base"),
                           ({"cron": "0 6 * * *", "payload": "{nope"}, "payload: not JSON"),
                           ({"timing": "every", "interval_seconds": "soon"}, "give a number of seconds")):
        page = client.post("/ui/schedules/form", data={**base, **changes})
        assert page.status_code == 400, (changes, page.text)
        alert = re.search(r'<p class="error" role="alert" data-field="error">(.*?)</p>', page.text, re.S)
        assert alert and words in html.unescape(alert.group(1)) and "\n" not in alert.group(1), changes
        assert 'value="save"' not in page.text  # no Save until it checks
    # a refused save is audited as the API's refusal is
    refused = client.post("/ui/schedules/form", data={**base, "step": "save"})
    assert refused.status_code == 400
    assert db.execute("SELECT action, outcome FROM skiplock.audit_log").fetchall() == [("schedule.create",
                                                                                         "request.invalid")]
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0


def test_a_reader_cannot_open_or_post_the_schedule_form(make_app, db):
    client = make_app().test_client()
    sign_in(client, "reader")
    assert 'href="/ui/schedules/new"' not in client.get("/ui/schedules").text
    assert client.get("/ui/schedules/new").status_code == 403
    csrf = csrf_of(client.get("/ui/schedules").text)
    r = client.post("/ui/schedules/form", data={"csrf": csrf, "name": "x", "kind": "k", "cron": "* * * * *",
                                                "step": "save"})
    assert r.status_code == 403
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0


def test_the_api_checks_a_schedule_and_shows_its_next_fires(make_app, db):
    client = make_app().test_client()
    reader = {"Authorization": f"Bearer {TOKENS['reader']}"}
    r = client.post("/v1/schedules:check", headers=reader, json={"name": "x", "kind": "k", "interval_seconds": 60})
    assert r.status_code == 200, r.text
    fires = [dt.datetime.fromisoformat(f.replace("Z", "+00:00")) for f in r.json["next_fires"]]
    assert r.json["timing"] == "every 60s" and len(fires) == 5
    assert [(b - a).total_seconds() for a, b in zip(fires, fires[1:])] == [60.0] * 4
    bad = client.post("/v1/schedules:check", headers=reader, json={"name": "x", "kind": "k", "cron": "* * *"})
    assert bad.status_code == 400 and bad.json["error"]["code"] == "request.invalid"
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0
    assert client.post("/v1/schedules:check", json={"name": "x", "kind": "k", "cron": "@daily"}).status_code == 401

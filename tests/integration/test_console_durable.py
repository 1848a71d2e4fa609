"""The console's views of durable execution (Flask's test client, real Postgres, tasks suspended
by a real worker's run): a task's page shows its step log and what it waits for, the tasks page
the reason of each waiting task, and the signals page lists signals and, for admins only, sends
one through POST /v1/signals' view (its audit row; a refused one shown in the page as one line,
audited too, nothing written)."""

from __future__ import annotations

import html
import re

from tests.integration.test_console import csrf_of, make_app, sign_in  # noqa: F401 (fixture)
from tests.integration.test_durable import worker  # noqa: F401 (fixture)
from tests.support.suspended import suspend_one_of_each


def audit(db) -> list[tuple]:
    return db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log ORDER BY id").fetchall()


def field(page: str, name: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m)).strip()
            for m in re.findall(rf'data-field="{name}">(.*?)</(?:dd|code|span)>', page, re.S)]


def test_a_tasks_page_shows_its_steps_and_what_it_waits_for(make_app, worker, db_url, db):
    ids = suspend_one_of_each(worker, db_url, db)
    client = make_app().test_client()
    sign_in(client, "reader")
    page = client.get(f"/ui/tasks/{ids['sleep']}").text
    [waiting] = field(page, "waiting_for")
    assert re.fullmatch(r"sleeping until 20\d\d-\d\d-\d\dT[0-9:.]+Z", waiting), waiting
    assert field(page, "step") == ["a", "sleep"]
    results = field(page, "step_result")
    assert results[0] == "1" and results[1].startswith('{"until":"20')
    rows = re.findall(r'<tr data-step="(\d+)">(.*?)</tr>', page, re.S)
    assert [n for n, _ in rows] == ["1", "2"]
    assert re.findall(r'<td class="num">(\d+)</td>', rows[0][1])[:2] == ["1", "1"]  # position, attempt
    signal_page = client.get(f"/ui/tasks/{ids['signal']}").text
    [waiting] = field(signal_page, "waiting_for")
    assert waiting.startswith("waiting for signal order-1.confirmed (timeout 20"), waiting
    assert field(client.get(f"/ui/tasks/{ids['tasks']}").text, "waiting_for") == ["waiting for 2 tasks"]
    parents_page = client.get(f"/ui/tasks/{ids['parents']}").text
    assert field(parents_page, "waiting_for") == ["waiting for 1 parent"]
    assert "<h2>Steps</h2>" not in parents_page  # no steps, no section

    listed = client.get("/ui/tasks?state=waiting").text
    reasons = dict(re.findall(r'<tr data-task="([0-9a-f-]+)">.*?data-field="waiting_for">(.*?)</span>', listed, re.S))
    assert reasons[ids["tasks"]] == "waiting for 2 tasks" and reasons[ids["parents"]] == "waiting for 1 parent"
    assert reasons[ids["sleep"]].startswith("sleeping until") and "order-1.confirmed" in reasons[ids["signal"]]
    assert "data-field=\"waiting_for\"" not in client.get("/ui/tasks?state=queued").text


def test_an_admin_sends_a_signal_from_the_console_and_it_is_audited(make_app, worker, db_url, db):
    ids = suspend_one_of_each(worker, db_url, db)
    client = make_app().test_client()
    sign_in(client, "admin")
    page = client.get("/ui/signals").text
    assert "Send signal</button>" in page and "No signal matches." in page
    sent = client.post("/ui/signals", data={"csrf": csrf_of(page), "name": "order-1.confirmed",
                                            "payload": '{"by": "warehouse"}'})
    assert sent.status_code == 303
    page = client.get(sent.headers["Location"]).text
    assert '<p class="notice" role="status">Sent order-1.confirmed: 1 task(s) woken.</p>' in page
    assert field(page, "payload") == ['{"by":"warehouse"}']
    assert db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (ids["signal"],)).fetchone() == ("queued",)
    again = client.post("/ui/signals", data={"csrf": csrf_of(page), "name": "order-1.confirmed", "payload": ""})
    assert "order-1.confirmed was sent before: nothing changed." in client.get(again.headers["Location"]).text
    assert audit(db) == [("admin-bot", "signal.send", "order-1.confirmed", "ok")] * 2
    assert "Signals</a>" in page


def test_a_refused_signal_is_one_line_in_the_page_audited_and_writes_nothing(make_app, db):
    client = make_app(max_payload_bytes=100).test_client()
    sign_in(client, "admin")
    csrf = csrf_of(client.get("/ui/signals").text)
    for form, status, line in (
            ({"name": "", "payload": ""}, 400, "request.invalid</code>: signal name must be 1-200 characters (got 0)"),
            ({"name": "ok", "payload": "{nope"}, 400, "request.invalid</code>: payload is not valid JSON: Expecting "
                                                       "property name enclosed in double quotes"),
            ({"name": "ok", "payload": '"' + "x" * 200 + '"'}, 413,
             "task.payload_too_large</code>: signal payload is 202 bytes; the limit is 100")):
        refused = client.post("/ui/signals", data={"csrf": csrf, **form})
        assert refused.status_code == status and line in refused.text, refused.text
        alert = re.findall(r'<p class="error" role="alert">(.*?)</p>', refused.text, re.S)
        assert len(alert) == 1 and "\n" not in alert[0]
        assert f'value="{html.escape(form["name"])}"' in refused.text  # what was typed is kept
    assert db.execute("SELECT count(*) FROM skiplock.signals").fetchone()[0] == 0
    assert [row[1:] for row in audit(db)] == [("signal.send", None, "request.invalid"),
                                              ("signal.send", None, "request.invalid"),
                                              ("signal.send", None, "task.payload_too_large")]


def test_the_send_form_is_for_admins_only(make_app, db):
    client = make_app().test_client()
    sign_in(client, "submitter")
    page = client.get("/ui/signals")
    assert page.status_code == 200 and "Send signal</button>" not in page.text
    refused = client.post("/ui/signals", data={"csrf": csrf_of(page.text), "name": "x", "payload": ""})
    assert refused.status_code == 403
    assert db.execute("SELECT count(*) FROM skiplock.signals").fetchone()[0] == 0

"""The web console (/ui/) through Flask's test client on a real database: sign-in and its cookie,
CSRF, roles (a reader sees no button and a forged POST is refused), the security headers, the
pages' numbers and the audit rows its actions write. The browser tests are in
tests/acceptance/test_console_browser.py."""

from __future__ import annotations

import re
import uuid

import pytest

from skiplock.api.app import close_app, create_app
import skiplock
from tests.integration.test_api import TOKEN_CONFIG, TOKENS, api_settings


@pytest.fixture
def make_app(db_url):
    apps = []

    def make(settings=None, **overrides):
        app = create_app(settings or api_settings(db_url, **overrides))
        apps.append(app)
        return app

    yield make
    for app in apps:
        close_app(app)


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def sign_in(client, role: str):
    page = client.get("/ui/login")
    r = client.post("/ui/login", data={"token": TOKENS[role], "csrf": csrf_of(page.text)})
    assert (r.status_code, r.headers["Location"]) == (303, "/ui/"), r.text
    return r


def test_sign_in_sets_a_lax_httponly_expiring_cookie(make_app):
    client = make_app().test_client()
    assert client.get("/").headers["Location"] == "/ui/"
    assert client.get("/v1/").status_code == 200
    r = client.get("/ui/")
    assert (r.status_code, r.headers["Location"]) == (302, "/ui/login")
    login = client.get("/ui/login")
    assert '<input id="token" name="token"' in login.text
    r = sign_in(client, "reader")
    cookie = r.headers["Set-Cookie"]
    # Lax: a link from another site opens the console signed in (its POSTs never carry the cookie)
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Max-Age=28800" in cookie
    assert "Secure" not in cookie and "Path=/ui/" in cookie
    assert client.get("/ui/").status_code == 200
    # behind a TLS-terminating proxy that says so, the cookie is Secure
    behind = make_app().test_client()
    page = behind.get("/ui/login", headers={"X-Forwarded-Proto": "https"})
    assert "; Secure" in page.headers["Set-Cookie"]


def test_a_bad_token_or_a_tampered_cookie_is_refused(make_app):
    client = make_app().test_client()
    page = client.get("/ui/login")
    r = client.post("/ui/login", data={"token": "not-a-token", "csrf": csrf_of(page.text)})
    assert r.status_code == 401 and "That token is not valid." in r.text
    assert client.get("/ui/").status_code == 302
    sign_in(client, "admin")
    cookie = client.get_cookie("skiplock_console", path="/ui/")
    client.set_cookie("skiplock_console", cookie.value[:-2] + "xx", path="/ui/")
    assert client.get("/ui/").headers["Location"] == "/ui/login"


def test_a_post_without_its_csrf_token_is_refused(make_app, db):
    client = make_app().test_client()
    sign_in(client, "admin")
    assert client.post("/ui/queues/mail/pause").status_code == 403
    assert client.post("/ui/queues/mail/pause", data={"csrf": "forged"}).status_code == 403
    # nor can another browser sign itself in with a form it did not get (login CSRF)
    assert make_app().test_client().post("/ui/login", data={"token": TOKENS["admin"]}).status_code == 403
    assert db.execute("SELECT count(*) FROM skiplock.pauses").fetchone()[0] == 0
    ok = client.post("/ui/queues/mail/pause", data={"csrf": csrf_of(client.get("/ui/").text)})
    assert (ok.status_code, ok.headers["Location"]) == (303, "/ui/")
    assert db.execute("SELECT scope, name FROM skiplock.pauses").fetchall() == [("queue", "mail")]


def test_a_reader_sees_no_button_and_a_forged_post_is_refused(make_app, db_url, db):
    task_id = skiplock.enqueue(db_url, "k", {}, queue="mail")
    client = make_app().test_client()
    sign_in(client, "reader")
    overview = client.get("/ui/")
    assert 'data-queue="mail"' in overview.text and "<button type=\"submit\">Pause" not in overview.text
    assert "Cancel</button>" not in client.get(f"/ui/tasks/{task_id}").text
    assert client.get("/ui/audit").status_code == 403
    csrf = csrf_of(overview.text)  # the sign-out form's: a valid CSRF token, only the role is missing
    assert client.post("/ui/queues/mail/pause", data={"csrf": csrf}).status_code == 403
    assert client.post(f"/ui/tasks/{task_id}/cancel", data={"csrf": csrf}).status_code == 403
    assert db.execute("SELECT count(*) FROM skiplock.pauses").fetchone()[0] == 0
    assert db.execute("SELECT state FROM skiplock.tasks").fetchone()[0] == "queued"


def test_actions_run_the_api_and_write_its_audit_rows(make_app, db_url, store, db):
    task_id = skiplock.enqueue(db_url, "k", {"n": 1})
    client = make_app().test_client()
    sign_in(client, "admin")
    page = client.get(f"/ui/tasks/{task_id}")
    assert "Cancel</button>" in page.text and "Resume</button>" not in page.text
    r = client.post(f"/ui/tasks/{task_id}/cancel", data={"csrf": csrf_of(page.text)})
    assert r.status_code == 303
    page = client.get(f"/ui/tasks/{task_id}")
    assert 'data-field="state">cancelled<' in page.text and "Resume</button>" in page.text
    # resuming twice: the second is refused as the API refuses it, and audited the same way
    csrf = csrf_of(page.text)
    assert client.post(f"/ui/tasks/{task_id}/resume", data={"csrf": csrf}).status_code == 303
    refused = client.post(f"/ui/tasks/{task_id}/resume", data={"csrf": csrf})
    assert refused.status_code == 409 and "task.not_resumable" in refused.text
    rows = db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log ORDER BY id").fetchall()
    assert rows == [("admin-bot", "task.cancel", str(task_id), "ok"), ("admin-bot", "task.resume", str(task_id), "ok"),
                    ("admin-bot", "task.resume", str(task_id), "task.not_resumable")]
    audit = client.get("/ui/audit?action=task.resume")
    assert audit.text.count("<td>task.resume</td>") == 2
    events = [e.type for e in store.tasks.task_events_list(task_id)]
    assert events == ["queued", "cancelled", "resumed"]
    assert re.findall(r'data-seq="(\d+)" data-type="(\w+)"', page.text) == [("1", "queued"), ("2", "cancelled")]


def test_the_pages_show_the_numbers_and_page_with_the_api_cursor(make_app, db_url):
    for queue in ("mail", "mail", "mail", "bulk"):
        skiplock.enqueue(db_url, "k", {}, queue=queue)
    client = make_app().test_client()
    sign_in(client, "reader")
    overview = client.get("/ui/").text
    row = re.search(r'<tr data-queue="mail">(.*?)</tr>', overview, re.S).group(1)
    assert re.search(r'data-state="queued">.*?>3</a>', row) and 'data-field="claimable">3<' in row
    first = client.get("/ui/tasks?queue=mail&state=&limit=2")
    assert first.status_code == 200 and first.text.count("<tr data-task=") == 2
    following = re.search(r'<a rel="next" href="([^"]+)"', first.text).group(1).replace("&amp;", "&")
    assert "cursor=" in following and "queue=mail" in following
    second = client.get(following)
    assert second.text.count("<tr data-task=") == 1 and 'rel="next"' not in second.text
    # a filter the API refuses is refused here with the API's message
    bad = client.get("/ui/tasks?state=sleeping")
    assert bad.status_code == 400 and "request.invalid" in bad.text
    assert client.get(f"/ui/tasks/{uuid.uuid4()}").status_code == 404


def test_security_headers_and_packaged_assets(make_app):
    client = make_app().test_client()
    for path in ("/ui/login", "/ui/static/console.js", "/ui/nope"):
        r = client.get(path)
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp, path
        assert r.headers["Referrer-Policy"] == "no-referrer", path
    page = client.get("/ui/login").text
    assert "<script>" not in page and "<script " not in page.replace('<script src="/ui/static/console.js" defer>', "")
    assert "http://" not in page and "https://" not in page
    assert client.get("/ui/static/console.css").status_code == 200
    # counted with the API's requests, by route template
    metrics = client.get("/metrics").text
    assert re.search(r'skiplock_api_requests_total\{method="GET",route="/ui/login",status="200"\} [1-9]', metrics)
    assert 'route="/ui/static/<path:filename>"' in metrics


def test_without_authentication_every_page_says_so(make_app, db_url):
    skiplock.enqueue(db_url, "k", {}, queue="q")
    client = make_app(api_auth="disabled", api_tokens=()).test_client()
    page = client.get("/ui/")
    assert page.status_code == 200 and "No authentication" in page.text
    assert "No authentication" in client.get("/ui/tasks").text
    # the CSRF check still holds
    assert client.post("/ui/queues/q/pause").status_code == 403
    assert client.post("/ui/queues/q/pause", data={"csrf": csrf_of(page.text)}).status_code == 303


def test_schedules_webhooks_deliveries_kinds_and_workers(make_app, db):
    app = make_app()
    client = app.test_client()
    bearer = {"Authorization": f"Bearer {TOKENS['admin']}"}
    assert client.post("/v1/schedules", headers=bearer,
                       json={"name": "nightly", "kind": "reports.daily", "cron": "0 3 * * *"}).status_code == 201
    hook = client.post("/v1/webhooks", headers=bearer, json={"url": "https://93.184.216.34/hook", "events": ["task.*"],
                                                             "description": "billing"})
    assert hook.status_code == 201 and hook.json["secret"]
    task_id = client.post("/v1/tasks", headers=bearer, json={"kind": "k"}).json["id"]
    db.execute("UPDATE skiplock.webhook_deliveries SET state = 'dead', attempts = 8, last_status = 500, "
               "last_error = 'HTTP 500'")
    sign_in(client, "admin")
    page = client.get("/ui/webhooks").text
    assert re.search(r'data-field="dead"><a href="[^"]+">1</a>', page) and "Redeliver</button>" in page
    dead = client.get("/ui/deliveries?state=dead").text
    [delivery_id] = re.findall(r'<tr data-delivery="([^"]+)">', dead)
    assert "HTTP 500" in dead and "Redeliver</button>" in dead
    assert client.post(f"/ui/deliveries/{delivery_id}/redeliver", data={"csrf": csrf_of(dead)}).status_code == 303
    assert db.execute("SELECT state, attempts FROM skiplock.webhook_deliveries").fetchall() == [("pending", 0)]
    assert "No delivery matches." in client.get("/ui/deliveries?state=dead").text
    # a task's kind paused from its page, resumed from the overview
    page = client.get(f"/ui/tasks/{task_id}").text
    assert client.post("/ui/kinds/k/pause", data={"csrf": csrf_of(page)}).status_code == 303
    overview = client.get("/ui/").text
    assert '<li data-kind="k">' in overview
    assert client.post("/ui/kinds/k/resume", data={"csrf": csrf_of(overview)}).status_code == 303
    assert '<li data-kind="k">' not in client.get("/ui/").text
    page = client.get("/ui/schedules").text
    assert '<tr data-schedule="nightly">' in page and "<code>0 3 * * *</code>" in page
    assert client.post("/ui/schedules/nightly/pause", data={"csrf": csrf_of(page)}).status_code == 303
    assert 'data-field="enabled">paused<' in client.get("/ui/schedules").text
    page = client.get("/ui/webhooks").text
    assert "https://93.184.216.34/hook" in page and hook.json["secret"] not in page
    assert client.post(f"/ui/webhooks/{hook.json['id']}/disable", data={"csrf": csrf_of(page)}).status_code == 303
    assert 'data-field="enabled">no (disabled by admin-bot)<' in client.get("/ui/webhooks").text
    assert "No worker is running." in client.get("/ui/workers").text
    rows = db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log WHERE actor = 'admin-bot' "
                      "AND action NOT IN ('schedule.create', 'webhook.create', 'task.submit') ORDER BY id").fetchall()
    assert rows == [("admin-bot", "delivery.redeliver", delivery_id, "ok"), ("admin-bot", "kind.pause", "k", "ok"),
                    ("admin-bot", "kind.resume", "k", "ok"), ("admin-bot", "schedule.update", "nightly", "ok"),
                    ("admin-bot", "webhook.disable", str(hook.json["id"]), "ok")]

    reader = app.test_client()
    sign_in(reader, "reader")
    page = reader.get("/ui/schedules").text
    assert '<tr data-schedule="nightly">' in page and "Resume</button>" not in page and "Webhooks</a>" not in page
    assert reader.get("/ui/webhooks").status_code == 403 and reader.get("/ui/deliveries").status_code == 403
    assert "Pause kind" not in reader.get(f"/ui/tasks/{task_id}").text
    assert reader.post("/ui/schedules/nightly/resume", data={"csrf": csrf_of(page)}).status_code == 403
    assert reader.get("/ui/workers").status_code == 200


def test_bulk_actions_act_on_the_filter_shown(make_app, db_url, db):
    for queue in ("b", "b", "b", "other"):
        skiplock.enqueue(db_url, "k", {}, queue=queue)
    app = make_app()
    client = app.test_client()
    sign_in(client, "admin")
    assert "Cancel all waiting, queued or running</button>" not in client.get("/ui/tasks").text  # no filter, no bulk action
    page = client.get("/ui/tasks?queue=b&limit=2").text
    assert 'name="queue" value="b"' in page and "Purge all finished</button>" in page and 'name="limit"' in page
    r = client.post("/ui/tasks:cancel", data={"csrf": csrf_of(page), "queue": "b"})
    assert r.status_code == 303 and "changed=3" in r.headers["Location"] and "queue=b" in r.headers["Location"]
    assert "3 task(s) changed." in client.get(r.headers["Location"]).text
    assert dict(db.execute("SELECT queue, count(*) FROM skiplock.tasks WHERE state = 'cancelled' GROUP BY queue")
                .fetchall()) == {"b": 3}
    assert client.post("/ui/tasks:purge", data={"csrf": csrf_of(page), "queue": "b"}).status_code == 303
    assert db.execute("SELECT queue, state FROM skiplock.tasks").fetchall() == [("other", "queued")]
    # no criterion at all is refused as the API refuses it
    assert client.post("/ui/tasks:retry", data={"csrf": csrf_of(page)}).status_code == 400
    assert db.execute("SELECT actor, action, outcome FROM skiplock.audit_log ORDER BY id").fetchall()[:2] == [
        ("admin-bot", "task.cancel_many", "ok"), ("admin-bot", "task.purge_many", "ok")]

    reader = app.test_client()
    sign_in(reader, "reader")
    page = reader.get("/ui/tasks?queue=other").text
    assert "Cancel all waiting, queued or running</button>" not in page
    assert reader.post("/ui/tasks:cancel", data={"csrf": csrf_of(page), "queue": "other"}).status_code == 403
    assert db.execute("SELECT state FROM skiplock.tasks").fetchall() == [("queued",)]


def test_a_cookie_signed_from_the_token_list_is_refused(make_app, db):
    """What an attacker who reads SKIPLOCK_API_TOKENS (a ConfigMap, the chart's values) could
    sign: the key older releases derived from the list, over an admin session with a CSRF token
    of the attacker's choosing (and the token's fingerprint, public too). It opens nothing."""
    import hashlib
    import hmac

    from itsdangerous import URLSafeTimedSerializer

    from skiplock.engine.settings import parse_api_tokens

    tokens = parse_api_tokens(TOKEN_CONFIG)
    material = "\n".join(f"{t.name}:{t.role}:{t.sha256}" for t in sorted(tokens))
    derived = hmac.new(b"skiplock console session v1", material.encode(), hashlib.sha256).digest()
    admin = next(t for t in tokens if t.role == "admin")
    forged = URLSafeTimedSerializer(derived, salt="skiplock.console").dumps(
        {"c": "attacker-csrf", "n": admin.name, "t": admin.sha256[:16]})
    client = make_app().test_client()
    client.set_cookie("skiplock_console", forged, path="/ui/")
    assert client.get("/ui/").headers.get("Location") == "/ui/login"
    assert client.post("/ui/queues/mail/pause", data={"csrf": "attacker-csrf"}).status_code == 403
    assert db.execute("SELECT count(*) FROM skiplock.pauses").fetchone()[0] == 0


def test_rotating_the_session_key_ends_every_session(make_app, db_url, db):
    client = make_app().test_client()
    sign_in(client, "admin")
    cookie = client.get_cookie("skiplock_console", path="/ui/").value
    assert client.get("/ui/").status_code == 200
    # the same tokens, the same cookie, another key: signed in no more, and its CSRF token is dead
    rotated = make_app(console_session_key="another-console-session-key-0123456789").test_client()
    rotated.set_cookie("skiplock_console", cookie, path="/ui/")
    assert rotated.get("/ui/").headers["Location"] == "/ui/login"
    csrf = csrf_of(client.get("/ui/").text)
    assert rotated.post("/ui/queues/mail/pause", data={"csrf": csrf}).status_code == 403
    # the key alone decides: one more token in the list keeps the session
    from skiplock.engine.settings import parse_api_tokens

    more = parse_api_tokens(TOKEN_CONFIG + ",new-bot:reader:" + "0" * 64)
    kept = make_app(api_tokens=more).test_client()
    kept.set_cookie("skiplock_console", cookie, path="/ui/")
    assert kept.get("/ui/").status_code == 200
    assert db.execute("SELECT count(*) FROM skiplock.pauses").fetchone()[0] == 0


def test_a_revoked_or_rotated_token_ends_its_sessions(make_app):
    from skiplock.engine.settings import parse_api_tokens

    client = make_app().test_client()
    sign_in(client, "admin")
    cookie = client.get_cookie("skiplock_console", path="/ui/").value
    others = [e for e in TOKEN_CONFIG.split(",") if not e.startswith("admin-bot:")]
    for entries in (others, others + ["admin-bot:admin:" + "1" * 64]):  # removed; a new token, same name
        changed = make_app(api_tokens=parse_api_tokens(",".join(entries))).test_client()
        changed.set_cookie("skiplock_console", cookie, path="/ui/")
        assert changed.get("/ui/").headers["Location"] == "/ui/login", entries


def test_without_a_session_key_the_console_is_disabled_and_the_api_serves(make_app, caplog):
    client = make_app(console_session_key=None).test_client()
    for method, path in (("GET", "/ui/"), ("GET", "/ui/login"), ("POST", "/ui/login")):
        r = client.open(path, method=method, data={"token": TOKENS["admin"]})
        assert r.status_code == 503, (method, path)
        assert "console.disabled" in r.text and "set SKIPLOCK_CONSOLE_SESSION_KEY" in r.text
        assert "Set-Cookie" not in r.headers
    assert client.get("/ui/static/console.css").status_code == 200
    assert client.get("/v1/queues", headers={"Authorization": f"Bearer {TOKENS['reader']}"}).status_code == 200
    assert [m for m in caplog.messages if "console is disabled" in m] != []


def test_a_refused_action_is_audited_as_the_api_audits_it(make_app, db):
    client = make_app().test_client()
    sign_in(client, "admin")
    # here: a path value that is no task id
    page = client.get("/ui/").text
    assert client.post("/ui/tasks/not-a-task/cancel", data={"csrf": csrf_of(page)}).status_code == 400
    assert db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log").fetchall() == [
        ("admin-bot", "task.cancel", "not-a-task", "request.invalid")]


def test_ticked_tasks_are_retried_or_cancelled_and_the_others_left_alone(make_app, db_url, db):
    failed = [skiplock.enqueue(db_url, "k", {}, queue="sel") for _ in range(3)]
    db.execute("UPDATE skiplock.tasks SET state = 'failed', finished_at = now() WHERE id = ANY(%s)", (failed,))
    queued = [skiplock.enqueue(db_url, "k", {}, queue="sel") for _ in range(2)]
    app = make_app()
    client = app.test_client()
    sign_in(client, "admin")
    page = client.get("/ui/tasks?queue=sel").text
    assert page.count('type="checkbox" form="selected" name="ids"') == 5
    # the time range, id and idempotency key filters are on the form, named as GET /v1/tasks names them
    for name in ("created_after", "created_before", "id", "idempotency_key"):
        assert f'name="{name}"' in page
    assert client.get(f"/ui/tasks?id={failed[0]}").text.count('name="ids"') == 1
    assert client.get("/ui/tasks?queue=sel&created_after=2999-01-01T00:00Z").text.count('name="ids"') == 0
    assert client.get("/ui/tasks?queue=sel&created_before=2999-01-01T00:00Z").text.count('name="ids"') == 5

    r = client.post("/ui/tasks:retry", data={"csrf": csrf_of(page), "ids": failed[:2]})
    assert r.status_code == 303 and "changed=2" in r.headers["Location"]
    states = dict(db.execute("SELECT id::text, state FROM skiplock.tasks").fetchall())
    assert [states[str(i)] for i in failed] == ["queued", "queued", "failed"]
    r = client.post("/ui/tasks:cancel", data={"csrf": csrf_of(page), "ids": [queued[0]]})
    assert "changed=1" in r.headers["Location"]
    states = dict(db.execute("SELECT id::text, state FROM skiplock.tasks").fetchall())
    assert [states[str(i)] for i in queued] == ["cancelled", "queued"]
    assert db.execute("SELECT action, outcome FROM skiplock.audit_log ORDER BY id").fetchall() == [
        ("task.retry_many", "ok"), ("task.cancel_many", "ok")]

    reader = app.test_client()
    sign_in(reader, "reader")
    page = reader.get("/ui/tasks?queue=sel").text
    assert 'name="ids"' not in page and "Retry selected" not in page
    assert reader.post("/ui/tasks:retry", data={"csrf": csrf_of(page), "ids": [failed[2]]}).status_code == 403


def test_the_largest_real_form_fits_the_body_limit_and_one_byte_more_is_refused(make_app, db_url, db):
    ids = [str(uuid.uuid4()) for _ in range(500)]  # a full page of ticked tasks (GET /v1/tasks' most)
    client = make_app().test_client()
    sign_in(client, "admin")
    csrf = csrf_of(client.get("/ui/").text)
    r = client.post("/ui/tasks:cancel", data={"csrf": csrf, "ids": ids})
    assert (r.status_code, "changed=0" in r.headers["Location"]) == (303, True)
    filler = "x" * (64 * 1024 - len(f"csrf={csrf}&queue=q&reason="))
    exact = f"csrf={csrf}&queue=q&reason={filler}"
    assert len(exact) == 64 * 1024
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    assert client.post("/ui/queues/q/pause", data=exact, headers=headers).status_code == 303
    assert client.post("/ui/queues/q/resume", data=exact + "x", headers=headers).status_code == 413
    multipart = client.post("/ui/queues/q/resume", data={"csrf": csrf}, content_type="multipart/form-data")
    assert multipart.status_code == 415
    assert db.execute("SELECT scope, name FROM skiplock.pauses").fetchall() == [("queue", "q")]

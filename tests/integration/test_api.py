"""The HTTP API through the real WSGI app (Flask's test client) against real Postgres: every route,
role and status, the seed's cancel/resume table with its audit rows, idempotent submits (also 20
at once), batches, pagination, bad input, the OpenAPI document against the URL map."""

from __future__ import annotations

import hashlib
import shutil
import threading
import uuid

import psycopg
import pytest

from skiplock.api.app import close_app, create_app
from skiplock.engine.errors import ConfigError
from skiplock.engine.model import Settlement
from skiplock.engine.settings import Settings, parse_api_tokens
from tests.support.harness import sample, samples_of

TOKENS = {"admin": "admin-token", "submitter": "submitter-token", "reader": "reader-token"}
TOKEN_CONFIG = ",".join(f"{role}-bot:{role}:{hashlib.sha256(token.encode()).hexdigest()}"
                        for role, token in TOKENS.items())

# the console's session key of every test API (a secret there; here only long enough)
CONSOLE_SESSION_KEY = "test-console-session-key-0123456789abcdef"


def api_settings(db_url: str, **overrides) -> Settings:
    overrides.setdefault("api_tokens", parse_api_tokens(TOKEN_CONFIG))
    overrides.setdefault("console_session_key", CONSOLE_SESSION_KEY)
    return Settings(database_url=db_url, **overrides)


class Api:
    """The test client with a role: `api.post("/v1/tasks", json=..., role="reader")`."""

    def __init__(self, app):
        self.app, self.client = app, app.test_client()

    def request(self, method: str, path: str, role: str | None = "admin", headers: dict | None = None, **kwargs):
        headers = dict(headers or {})
        if role is not None:
            headers["Authorization"] = f"Bearer {TOKENS[role]}"
        return self.client.open(path, method=method, headers=headers, **kwargs)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)


@pytest.fixture
def make_api(db_url):
    apps = []

    def make(**overrides) -> Api:
        app = create_app(api_settings(db_url, **overrides))
        apps.append(app)
        return Api(app)

    yield make
    for app in apps:
        close_app(app)


@pytest.fixture
def api(make_api) -> Api:
    return make_api()


def audit_rows(db, target=None) -> list[tuple]:
    return db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log "
                      "WHERE %(t)s::text IS NULL OR target = %(t)s ORDER BY id", {"t": target}).fetchall()


def count(db, sql: str, params=None) -> int:
    return db.execute(sql, params).fetchone()[0]


def error_of(response) -> tuple[int, str, str]:
    body = response.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


# ---- submit and read ---------------------------------------------------------------------------

def test_submit_read_list_and_events(api, db):
    r = api.post("/v1/tasks", json={"kind": "reports.daily", "queue": "q1", "priority": 5,
                                    "payload": {"n": 1, "nested": {"ü": [1, 2.5, None]}}, "max_attempts": 4,
                                    "delay": 60, "deadline": "2099-01-01T00:00:00+02:00"}, role="submitter")
    assert r.status_code == 201, r.get_json()
    task = r.get_json()
    assert r.headers["Location"] == f"/v1/tasks/{task['id']}"
    assert (task["kind"], task["queue"], task["priority"], task["state"], task["max_attempts"]) == \
        ("reports.daily", "q1", 5, "queued", 4)
    assert task["payload"] == {"n": 1, "nested": {"ü": [1, 2.5, None]}}
    assert task["deadline"] == "2098-12-31T22:00:00Z"
    row = db.execute("SELECT deadline, run_after > now() + interval '50 seconds' FROM skiplock.tasks WHERE id = %s",
                     (task["id"],)).fetchone()
    assert row[0].isoformat() == "2098-12-31T22:00:00+00:00" and row[1] is True

    read = api.get(f"/v1/tasks/{task['id']}", role="reader").get_json()
    # the read adds the task's relatives (the submission's answer does not)
    assert (read.pop("parents"), read.pop("children"), read.pop("parents_truncated"),
            read.pop("children_truncated")) == ([], [], False, False)
    assert read == task
    events = api.get(f"/v1/tasks/{task['id']}/events", role="reader").get_json()["events"]
    assert [(e["seq"], e["type"]) for e in events] == [(1, "queued")]
    assert audit_rows(db) == [("submitter-bot", "task.submit", task["id"], "ok")]

    api.post("/v1/tasks", json={"kind": "other", "queue": "q2"})
    listed = api.get("/v1/tasks?queue=q1&state=queued&kind=reports.daily", role="reader").get_json()
    assert [t["id"] for t in listed["tasks"]] == [task["id"]] and listed["next_cursor"] is None
    assert listed["tasks"][0]["payload"] == task["payload"]
    assert api.get("/v1/tasks?queue=q1&state=running", role="reader").get_json()["tasks"] == []
    assert api.get(f"/v1/tasks/{uuid.uuid4()}", role="reader").get_json()["error"]["code"] == "task.not_found"
    assert error_of(api.get(f"/v1/tasks/{uuid.uuid4()}/events"))[:2] == (404, "task.not_found")


def test_run_at_and_created_range(api, db):
    r = api.post("/v1/tasks", json={"kind": "k", "run_at": "2099-05-01T10:00:00Z"})
    assert r.get_json()["run_after"] == "2099-05-01T10:00:00Z"
    created = r.get_json()["created_at"]
    assert [t["id"] for t in api.get(f"/v1/tasks?created_after={created}").get_json()["tasks"]] == [r.get_json()["id"]]
    assert api.get(f"/v1/tasks?created_before={created}").get_json()["tasks"] == []


def test_idempotent_submit_replays_and_conflicts(api, db):
    body = {"kind": "email.send", "payload": {"to": "a@example.com", "n": 1}}
    key = {"Idempotency-Key": "order-42"}
    first = api.post("/v1/tasks", json=body, headers=key, role="submitter")
    assert first.status_code == 201
    # the same submission: other key order, explicit defaults
    replay = api.post("/v1/tasks", json={"payload": {"n": 1, "to": "a@example.com"}, "queue": "default",
                                         "kind": "email.send", "priority": 0}, headers=key, role="submitter")
    assert replay.status_code == 200 and replay.get_json() == first.get_json()
    conflict = api.post("/v1/tasks", json={**body, "payload": {"to": "b@example.com"}}, headers=key,
                        role="submitter")
    assert error_of(conflict)[:2] == (409, "task.idempotency_conflict")
    assert "order-42" in error_of(conflict)[2]
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 1
    assert [r[1:] for r in audit_rows(db)] == [("task.submit", first.get_json()["id"], "ok"),
                                               ("task.submit", first.get_json()["id"], "ok"),
                                               ("task.submit", None, "task.idempotency_conflict")]


def test_a_key_taken_by_the_library_replays_on_equal_fields(api, db, db_url):
    import skiplock

    task_id = skiplock.enqueue(db_url, "k", {"a": 1}, idempotency_key="lib-key")
    same = api.post("/v1/tasks", json={"kind": "k", "payload": {"a": 1}}, headers={"Idempotency-Key": "lib-key"})
    assert (same.status_code, same.get_json()["id"]) == (200, str(task_id))
    other = api.post("/v1/tasks", json={"kind": "k", "payload": {"a": 2}}, headers={"Idempotency-Key": "lib-key"})
    assert other.status_code == 409


def test_twenty_concurrent_submits_with_one_key_make_one_task(api, db):
    barrier = threading.Barrier(20)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def submit():
        client = api.app.test_client()
        barrier.wait()
        r = client.post("/v1/tasks", json={"kind": "k", "payload": {"x": 1}},
                        headers={"Idempotency-Key": "same", "Authorization": f"Bearer {TOKENS['submitter']}"})
        with lock:
            results.append((r.status_code, r.get_json().get("id")))

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 20
    assert all(200 <= status < 300 for status, _ in results), results
    assert len({task_id for _, task_id in results}) == 1
    assert sorted(status for status, _ in results) == [200] * 19 + [201]
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 1
    assert count(db, "SELECT count(*) FROM skiplock.task_events") == 1


def test_batch_submit(api, db):
    r = api.post("/v1/tasks:batch", json={"tasks": [{"kind": "bulk", "payload": {"i": i}} for i in range(1000)]},
                 role="submitter")
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    assert body["created"] == 1000 and len({t["id"] for t in body["tasks"]}) == 1000
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 'bulk'") == 1000
    assert count(db, "SELECT count(*) FROM skiplock.task_events") == 1000
    assert audit_rows(db) == [("submitter-bot", "task.submit_batch", None, "ok")]

    too_many = api.post("/v1/tasks:batch", json={"tasks": [{"kind": "bulk"}] * 1001})
    assert error_of(too_many)[:2] == (400, "request.invalid") and "tasks" in error_of(too_many)[2]
    one_bad = api.post("/v1/tasks:batch", json={"tasks": [{"kind": "b"}] * 3 + [{"kind": "b", "priority": "high"}]})
    assert error_of(one_bad)[:2] == (400, "request.invalid")
    assert error_of(one_bad)[2].startswith("tasks[3].priority")
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 1000

    keyed = {"tasks": [{"kind": "b", "idempotency_key": "k1", "deadline": "2099-01-01T00:00:00Z"},
                       {"kind": "b", "idempotency_key": "k2"}, {"kind": "b", "idempotency_key": "k1",
                                                                 "deadline": "2099-01-01T00:00:00Z"}]}
    first = api.post("/v1/tasks:batch", json=keyed).get_json()
    assert [t["created"] for t in first["tasks"]] == [True, True, False]
    assert first["tasks"][0]["id"] == first["tasks"][2]["id"]
    again = api.post("/v1/tasks:batch", json=keyed)
    assert again.status_code == 200 and again.get_json()["created"] == 0
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE deadline IS NOT NULL") == 1
    conflict = api.post("/v1/tasks:batch", json={"tasks": [{"kind": "new"}, {"kind": "other", "idempotency_key": "k2"}]})
    assert error_of(conflict)[:2] == (409, "task.idempotency_conflict")
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 'new'") == 0


def test_payload_limits(make_api, db):
    api = make_api(max_payload_bytes=1000)
    ok = api.post("/v1/tasks", json={"kind": "k", "payload": {"s": "x" * 900}})
    assert ok.status_code == 201
    big = api.post("/v1/tasks", json={"kind": "k", "payload": {"s": "x" * 1000}})
    assert error_of(big)[:2] == (413, "task.payload_too_large")
    # a body over the limit is refused on its Content-Length, before it is read
    huge = api.post("/v1/tasks", data=b"{" + b" " * 200_000 + b"}", content_type="application/json")
    assert error_of(huge)[:2] == (413, "task.payload_too_large")
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 1


# ---- bad input -------------------------------------------------------------------------------------

BAD = [
    ("POST", "/v1/tasks", b"{not json", "body"),
    ("POST", "/v1/tasks", b"[1, 2]", "body"),
    ("POST", "/v1/tasks", b"\"text\"", "body"),
    ("POST", "/v1/tasks", b"", "body"),
    ("POST", "/v1/tasks", b"\xff\xfe", "body"),
    ("POST", "/v1/tasks", b'{"kind": "k", "priority": NaN}', "body"),
    ("POST", "/v1/tasks", b'{"kind": "k", "payload": {"s": "\\ud800"}}', "body"),
    ("POST", "/v1/tasks", b'{"kind": "k", "payload": {"s": "a\\u0000b"}}', "payload"),
    ("POST", "/v1/tasks", b'{"kind": "k", "payload": ' + b'[' * 100 + b']' * 100 + b'}', "body"),
    ("POST", "/v1/tasks", b'{"kind": "k", "payload": ' + b'[' * 5000 + b']' * 5000 + b'}', "body"),
    ("POST", "/v1/tasks", b'{"kind": "k", "colour": "red"}', "colour"),
    ("POST", "/v1/tasks", b'{"queue": "q"}', "kind"),
    ("POST", "/v1/tasks", b'{"kind": "no spaces"}', "kind"),
    ("POST", "/v1/tasks", b'{"kind": 7}', "kind"),
    ("POST", "/v1/tasks", b'{"kind": "k", "priority": 1.5}', "priority"),
    ("POST", "/v1/tasks", b'{"kind": "k", "priority": 40000}', "priority"),
    ("POST", "/v1/tasks", b'{"kind": "k", "priority": true}', "priority"),
    ("POST", "/v1/tasks", b'{"kind": "k", "payload": [1]}', "payload"),
    ("POST", "/v1/tasks", b'{"kind": "k", "max_attempts": 0}', "max_attempts"),
    ("POST", "/v1/tasks", b'{"kind": "k", "delay": -1}', "delay"),
    ("POST", "/v1/tasks", b'{"kind": "k", "delay": 1e400}', "delay"),
    ("POST", "/v1/tasks", b'{"kind": "k", "delay": 1, "run_at": "2030-01-01T00:00:00Z"}', "run_at"),
    ("POST", "/v1/tasks", b'{"kind": "k", "run_at": "2030-01-01T00:00:00"}', "run_at"),
    ("POST", "/v1/tasks", b'{"kind": "k", "run_at": "tomorrow"}', "run_at"),
    ("POST", "/v1/tasks", b'{"kind": "k", "deadline": "9999-12-31T23:59:59-14:00"}', "deadline"),
    ("POST", "/v1/tasks:batch", b'{"tasks": []}', "tasks"),
    ("POST", "/v1/tasks:batch", b'{"tasks": {}}', "tasks"),
    ("POST", "/v1/tasks:batch", b'{"tasks": [{"kind": "k", "idempotency_key": ""}]}', "tasks[0].idempotency_key"),
    ("GET", "/v1/tasks?limit=-1", None, "limit"),
    ("GET", "/v1/tasks?limit=501", None, "limit"),
    ("GET", "/v1/tasks?limit=ten", None, "limit"),
    ("GET", "/v1/tasks?state=done", None, "state"),
    ("GET", "/v1/tasks?cursor=nope", None, "cursor"),
    ("GET", "/v1/tasks?queue=a%00b", None, "queue"),
    ("GET", "/v1/tasks?sort=id", None, "sort"),
    ("GET", "/v1/tasks?state=queued&state=failed", None, "state"),
    ("GET", "/v1/tasks?created_after=yesterday", None, "created_after"),
    ("GET", "/v1/tasks/not-a-uuid", None, "task_id"),
    ("POST", "/v1/tasks/not-a-uuid/cancel", None, "task_id"),
    ("POST", f"/v1/tasks/{uuid.UUID(int=1)}/cancel", b'{"why": "x"}', "why"),
    ("POST", "/v1/queues/bad%20name/pause", None, "name"),
    ("GET", "/v1/audit?cursor=-5", None, "cursor"),
    ("POST", "/v1/schedules", b'{"name": "s", "kind": "k"}', "cron"),
    ("POST", "/v1/schedules", b'{"name": "s", "kind": "k", "cron": "61 * * * *"}', "cron"),
    ("POST", "/v1/schedules", b'{"name": "s", "kind": "k", "cron": "@daily", "timezone": "Mars/Base"}', "timezone"),
    ("POST", "/v1/schedules", b'{"name": "s", "kind": "k", "interval_seconds": 5, "overlap": "maybe"}', "overlap"),
    ("POST", "/v1/schedules", b'{"name": "s", "kind": "k", "interval_seconds": 5, "payload": {"a": "\\u0000"}}',
     "payload"),
    ("PATCH", "/v1/schedules/s", b'{"name": "t"}', "name"),
]


@pytest.mark.parametrize("method, path, body, field", BAD, ids=[f"{m} {p} {b!r:.40}" for m, p, b, _ in BAD])
def test_bad_input_is_a_4xx_naming_the_field(api, db, method, path, body, field):
    r = api.request(method, path, data=body, content_type="application/json")
    status, code, message = error_of(r)
    assert 400 <= status < 500 and code in ("request.invalid", "task.payload_too_large"), (status, code, message)
    assert field in message, message
    assert "Traceback" not in r.get_data(as_text=True)
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 0


def test_unknown_routes_and_methods_answer_json(api):
    assert error_of(api.get("/nope"))[:2] == (404, "request.not_found")
    assert error_of(api.get("/v1/tasks/"))[:2] == (404, "request.not_found")
    wrong = api.request("DELETE", "/v1/tasks")
    assert error_of(wrong)[:2] == (405, "request.method_not_allowed")
    assert wrong.headers["Allow"] == "GET, POST"
    assert error_of(api.request("PUT", "/v1/queues"))[:2] == (405, "request.method_not_allowed")


# ---- operate: the seed's table -----------------------------------------------------------------------

def finish(store, task_id, outcome: str) -> None:
    """Run a task to `outcome` the way a worker would: claim it, then settle."""
    [claimed] = store.tasks.task_claim(["default"], 1, "test-worker", 30)
    assert claimed.id == task_id
    assert store.tasks.task_settle([Settlement(task_id, claimed.lease_token, outcome, error="boom")]) == {task_id: outcome}


def test_cancel_resume_table_with_one_audit_row_each(api, db, store):
    def submit(payload):
        return uuid.UUID(api.post("/v1/tasks", json={"kind": "k", "payload": payload}).get_json()["id"])

    queued = submit({"case": "queued"})
    r = api.post(f"/v1/tasks/{queued}/cancel", json={"reason": "not needed"})
    assert (r.status_code, r.get_json()["state"]) == (200, "cancelled")
    r = api.post(f"/v1/tasks/{queued}/resume")
    assert (r.status_code, r.get_json()["state"], r.get_json()["attempts"]) == (200, "queued", 0)

    failed = submit({"case": "failed"})  # cancel + resume above left `queued` first in line: claim it away
    store.tasks.task_cancel(queued)
    finish(store, failed, "failed")
    r = api.post(f"/v1/tasks/{failed}/resume")
    assert (r.status_code, r.get_json()["state"], r.get_json()["attempts"]) == (200, "queued", 0)
    store.tasks.task_cancel(failed)

    completed = submit({"case": "completed"})
    finish(store, completed, "completed")
    assert error_of(api.post(f"/v1/tasks/{completed}/resume"))[:2] == (409, "task.not_resumable")
    assert error_of(api.post(f"/v1/tasks/{completed}/cancel"))[:2] == (409, "task.not_cancellable")

    running = submit({"case": "running"})
    [claimed] = store.tasks.task_claim(["default"], 1, "test-worker", 30)
    assert claimed.id == running
    r = api.post(f"/v1/tasks/{running}/cancel")
    assert (r.status_code, r.get_json()["state"]) == (200, "cancelling")
    assert error_of(api.post(f"/v1/tasks/{running}/resume"))[:2] == (409, "task.not_resumable")

    missing = uuid.uuid4()
    assert error_of(api.post(f"/v1/tasks/{missing}/cancel"))[:2] == (404, "task.not_found")

    assert [r[1:] for r in audit_rows(db) if r[1] != "task.submit"] == [
        ("task.cancel", str(queued), "ok"),
        ("task.resume", str(queued), "ok"),
        ("task.resume", str(failed), "ok"),
        ("task.resume", str(completed), "task.not_resumable"),
        ("task.cancel", str(completed), "task.not_cancellable"),
        ("task.cancel", str(running), "ok"),
        ("task.resume", str(running), "task.not_resumable"),
        ("task.cancel", str(missing), "task.not_found"),
    ]
    events = api.get(f"/v1/tasks/{queued}/events").get_json()["events"]
    assert [e["type"] for e in events][:3] == ["queued", "cancelled", "resumed"]
    assert events[1]["data"] == {"by": "admin-bot", "reason": "not needed"}
    listed = api.get("/v1/tasks?queue=default&state=cancelled").get_json()["tasks"]
    assert {t["id"]: t["payload"] for t in listed} == {str(queued): {"case": "queued"},
                                                       str(failed): {"case": "failed"}}


# ---- roles ---------------------------------------------------------------------------------------------

def test_roles_and_tokens(api, db):
    task_id = api.post("/v1/tasks", json={"kind": "k"}).get_json()["id"]
    before = (count(db, "SELECT count(*) FROM skiplock.tasks"), count(db, "SELECT count(*) FROM skiplock.audit_log"))
    writes = [("/v1/tasks", {"kind": "k"}), ("/v1/tasks:batch", {"tasks": [{"kind": "k"}]}),
              (f"/v1/tasks/{task_id}/cancel", None), ("/v1/queues/default/pause", None),
              ("/v1/schedules", {"name": "s", "kind": "k", "cron": "@daily"})]
    for path, body in writes:
        assert error_of(api.post(path, json=body, role="reader"))[:2] == (403, "auth.forbidden"), path
        assert error_of(api.post(path, json=body, role=None))[:2] == (401, "auth.unauthorized"), path
    for path in (f"/v1/tasks/{task_id}/cancel", "/v1/queues/default/pause", "/v1/kinds/k/pause"):
        assert api.post(path, role="submitter").status_code == 403
    assert api.get("/v1/audit", role="submitter").status_code == 403
    assert (count(db, "SELECT count(*) FROM skiplock.tasks"),
            count(db, "SELECT count(*) FROM skiplock.audit_log")) == before
    assert count(db, "SELECT count(*) FROM skiplock.pauses") == 0
    assert api.get(f"/v1/tasks/{task_id}", role="reader").status_code == 200

    for header in ("Bearer wrong", "Basic YWRtaW4=", "Bearer", "admin-token", "Bearer " + "x" * 5000):
        r = api.get("/v1/tasks", role=None, headers={"Authorization": header})
        assert error_of(r)[:2] == (401, "auth.unauthorized"), header
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    for public in ("/healthz", "/readyz", "/metrics", "/v1/openapi.json"):
        assert api.get(public, role=None).status_code == 200, public


def test_the_api_refuses_to_start_without_tokens(db_url):
    with pytest.raises(ConfigError, match="SKIPLOCK_API_TOKENS"):
        create_app(Settings(database_url=db_url))


def test_auth_disabled_serves_everyone_as_anonymous(db_url, db):
    app = create_app(Settings(database_url=db_url, api_auth="disabled"))
    try:
        r = app.test_client().post("/v1/queues/q/pause")
        assert r.status_code == 200
        assert audit_rows(db) == [("anonymous", "queue.pause", "q", "ok")]
    finally:
        close_app(app)


# ---- lists, queues, schedules, audit ---------------------------------------------------------------------

def test_keyset_pagination_is_stable_under_inserts(api):
    batch = api.post("/v1/tasks:batch", json={"tasks": [{"kind": "p", "payload": {"i": i}} for i in range(25)]})
    ids = [t["id"] for t in batch.get_json()["tasks"]]
    seen, cursor = [], None
    while True:
        r = api.get("/v1/tasks?kind=p&limit=10" + (f"&cursor={cursor}" if cursor else "")).get_json()
        seen += [t["id"] for t in r["tasks"]]
        api.post("/v1/tasks", json={"kind": "p", "payload": {"late": True}})  # newer: before the cursor
        cursor = r["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)


def test_queue_overview_and_pauses(api, db, store):
    api.post("/v1/tasks:batch", json={"tasks": [{"kind": "a", "queue": "q1"}] * 3 + [{"kind": "b", "queue": "q1"}]
                                     + [{"kind": "a", "queue": "q2", "delay": 3600}]})
    assert api.post("/v1/kinds/b/pause").get_json() == {"kind": "b", "paused": True}
    assert api.post("/v1/queues/q2/pause").get_json() == {"queue": "q2", "paused": True}
    assert api.post("/v1/queues/q2/pause").status_code == 200  # idempotent
    assert api.post("/v1/queues/empty/pause").status_code == 200
    overview = api.get("/v1/queues", role="reader").get_json()
    queues = {q["name"]: q for q in overview["queues"]}
    assert overview["paused_kinds"] == ["b"]
    assert list(queues) == ["empty", "q1", "q2"]
    assert queues["q1"]["tasks"]["queued"] == 4 and queues["q1"]["claimable"] == 3
    assert queues["q1"]["paused"] is False and queues["q1"]["oldest_claimable_age_seconds"] >= 0
    assert (queues["q2"]["claimable"], queues["q2"]["oldest_claimable_age_seconds"], queues["q2"]["paused"]) == \
        (0, None, True)
    assert queues["empty"]["tasks"] == dict.fromkeys(["waiting", "queued", "running", "cancelling", "completed",
                                                      "failed", "cancelled"], 0)
    assert store.tasks.task_claim(["q1", "q2"], 10, "w", 30) and len(store.tasks.task_claim(["q1"], 10, "w", 30)) == 0
    assert api.post("/v1/kinds/b/resume").get_json() == {"kind": "b", "paused": False}
    assert api.post("/v1/queues/q2/resume").get_json() == {"queue": "q2", "paused": False}
    assert [r[1:] for r in audit_rows(db) if r[1] != "task.submit_batch"] == [
        ("kind.pause", "b", "ok"), ("queue.pause", "q2", "ok"), ("queue.pause", "q2", "ok"),
        ("queue.pause", "empty", "ok"), ("kind.resume", "b", "ok"), ("queue.resume", "q2", "ok")]


def test_schedules_crud(api, db):
    created = api.post("/v1/schedules", json={"name": "nightly", "kind": "reports.daily", "cron": "0 3 * * *",
                                               "timezone": "Europe/Berlin", "payload": {"x": 1}})
    assert created.status_code == 201, created.get_json()
    assert created.get_json()["next_fire_at"].endswith("Z") and created.get_json()["fires"] == 0
    assert error_of(api.post("/v1/schedules", json={"name": "nightly", "kind": "other", "cron": "@daily"}))[:2] == \
        (409, "schedule.exists")
    assert api.get("/v1/schedules/nightly", role="reader").get_json()["payload"] == {"x": 1}
    paused = api.request("PATCH", "/v1/schedules/nightly", json={"enabled": False})
    assert paused.status_code == 200 and paused.get_json()["enabled"] is False
    retimed = api.request("PATCH", "/v1/schedules/nightly", json={"interval_seconds": 300, "enabled": True})
    assert (retimed.get_json()["cron"], retimed.get_json()["interval_seconds"]) == (None, 300.0)
    assert error_of(api.request("PATCH", "/v1/schedules/nightly", json={"cron": "bad"}))[:2] == \
        (400, "request.invalid")
    assert [s["name"] for s in api.get("/v1/schedules", role="reader").get_json()["schedules"]] == ["nightly"]
    assert api.request("DELETE", "/v1/schedules/nightly").status_code == 204
    assert error_of(api.get("/v1/schedules/nightly"))[:2] == (404, "schedule.not_found")
    assert error_of(api.request("DELETE", "/v1/schedules/nightly"))[:2] == (404, "schedule.not_found")
    assert error_of(api.request("PATCH", "/v1/schedules/nightly", json={"enabled": True}))[:2] == \
        (404, "schedule.not_found")
    assert count(db, "SELECT count(*) FROM skiplock.schedules") == 0
    assert [r[1:] for r in audit_rows(db)] == [
        ("schedule.create", "nightly", "ok"), ("schedule.create", "nightly", "schedule.exists"),
        ("schedule.update", "nightly", "ok"), ("schedule.update", "nightly", "ok"),
        ("schedule.update", "nightly", "request.invalid"), ("schedule.delete", "nightly", "ok"),
        ("schedule.delete", "nightly", "schedule.not_found"), ("schedule.update", "nightly", "schedule.not_found")]


def test_audit_listing(api):
    for name in ("a", "b", "c"):
        api.post(f"/v1/queues/{name}/pause", headers={"X-Request-Id": f"req-{name}"})
    api.post("/v1/kinds/k/pause")
    page1 = api.get("/v1/audit?action=queue.pause&limit=2").get_json()
    assert [(e["target"], e["request_id"], e["actor"]) for e in page1["entries"]] == \
        [("c", "req-c", "admin-bot"), ("b", "req-b", "admin-bot")]
    page2 = api.get(f"/v1/audit?action=queue.pause&limit=2&cursor={page1['next_cursor']}").get_json()
    assert [e["target"] for e in page2["entries"]] == ["a"] and page2["next_cursor"] is None
    assert len(api.get("/v1/audit?actor=admin-bot").get_json()["entries"]) == 4
    assert api.get("/v1/audit?target=k").get_json()["entries"][0]["action"] == "kind.pause"


# ---- document, probes, metrics ------------------------------------------------------------------------------

def test_openapi_document_matches_the_routes(api):
    from skiplock.api.openapi import openapi_path

    doc = api.get("/v1/openapi.json", role=None).get_json()
    assert doc["openapi"].startswith("3.")
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    registered = {(method, openapi_path(rule.rule)) for rule in api.app.url_map.iter_rules()
                  if rule.endpoint != "static" for method in rule.methods - {"HEAD", "OPTIONS"}}
    assert documented == registered
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (method, path)
            if op.get("security") != []:
                assert {"401", "403"} <= set(op["responses"]), (method, path)
            if "requestBody" in op:
                assert {"400", "413"} <= set(op["responses"]), (method, path)
    assert "409" in doc["paths"]["/v1/tasks/{task_id}/resume"]["post"]["responses"]


def test_readyz_reports_a_pending_migration(api, tmp_path, monkeypatch):
    from skiplock.engine.migrate import migrations_dir

    for f in migrations_dir().glob("*.sql"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "0999_future.sql").write_text("SELECT 1;")
    monkeypatch.setenv("SKIPLOCK_MIGRATIONS_DIR", str(tmp_path))
    r = api.get("/readyz", role=None)
    assert error_of(r)[0] == 503 and "0999_future.sql" in error_of(r)[2]
    monkeypatch.delenv("SKIPLOCK_MIGRATIONS_DIR")
    assert api.get("/readyz", role=None).get_json() == {"status": "ready"}
    assert api.get("/healthz", role=None).get_json() == {"status": "ok"}


def test_metrics_count_requests_by_route_template_and_status(api):
    task_id = api.post("/v1/tasks", json={"kind": "k"}).get_json()["id"]
    api.get(f"/v1/tasks/{task_id}")
    api.get(f"/v1/tasks/{uuid.uuid4()}")
    api.get("/random/path/1")
    samples = samples_of(api.get("/metrics", role=None).get_data(as_text=True))
    requests = "skiplock_api_requests_total"
    assert sample(samples, requests, method="GET", route="/v1/tasks/<task_id>", status="200") == 1
    assert sample(samples, requests, method="GET", route="/v1/tasks/<task_id>", status="404") == 1
    assert sample(samples, requests, method="GET", route="unmatched", status="404") == 1
    assert sample(samples, "skiplock_api_request_duration_seconds_count", method="POST", route="/v1/tasks",
                  status="201") == 1


def test_dead_tasks_are_listed_from_their_own_index_among_many_finished(api, db, db_url):
    """`?state=failed` must not read every completed row: 20,000 completed, 3 failed."""
    db.execute("INSERT INTO skiplock.tasks (id, kind, state, finished_at, event_seq) "
               "SELECT skiplock.uuid7(), 't.noop', 'completed', now(), 1 FROM generate_series(1, 20000)")
    dead = [row[0] for row in db.execute(
        "INSERT INTO skiplock.tasks (id, kind, state, finished_at, event_seq, last_error) "
        "SELECT skiplock.uuid7(), 't.noop', 'failed', now(), 1, 'boom' FROM generate_series(1, 3) "
        "RETURNING id").fetchall()]
    db.execute("ANALYZE skiplock.tasks")

    first = api.get("/v1/tasks?state=failed&limit=2", role="reader")
    assert first.status_code == 200, first.json
    page = first.json
    assert [t["id"] for t in page["tasks"]] == [str(i) for i in sorted(dead, reverse=True)[:2]]
    rest = api.get(f"/v1/tasks?state=failed&limit=2&cursor={page['next_cursor']}", role="reader").json
    assert [t["id"] for t in rest["tasks"]] == [str(min(dead))]

    from skiplock.engine.queries import load

    params = dict(queue=None, state="failed", kind=None, created_after=None, created_before=None,
                  ids=None, idempotency_key=None, cursor=None, limit=50)
    plan = "\n".join(r[0] for r in psycopg.ClientCursor(db).execute(
        "EXPLAIN (COSTS OFF) " + load("skiplock")["task_list"], params).fetchall())
    assert "tasks_dead" in plan and "Seq Scan" not in plan, plan

"""Webhook endpoints and deliveries over HTTP, through the real WSGI app against real Postgres:
every route, role and status; the secret shown once (POST and rotate-secret, never a GET); the
SSRF guard refusing private, loopback and metadata addresses with no row left behind and no
request sent to the URL; deliveries made by real task transitions, filtered and paged; redeliver
of dead deliveries; one audit row per mutating request."""

from __future__ import annotations

import uuid

import pytest
from pytest_httpserver import HTTPServer

from skiplock.engine.model import Settlement
from tests.integration.test_api import audit_rows, count, error_of, make_api  # noqa: F401 (a fixture)

LOCAL = ("127.0.0.0/8",)
SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkw"  # 32 bytes


@pytest.fixture
def api(make_api):  # noqa: F811
    """The API with receivers on 127.0.0.0/8 allowed (as in the tests of the dispatcher)."""
    return make_api(webhook_allowed_networks=LOCAL)


@pytest.fixture
def strict_api(make_api):  # noqa: F811
    """The API without an allow-list: only public addresses."""
    return make_api()


@pytest.fixture
def receiver():
    server = HTTPServer(host="127.0.0.1", port=0)
    server.start()
    yield server
    server.clear()
    server.stop()


def register(api, url="http://127.0.0.1:9999/hook", **fields) -> dict:
    r = api.post("/v1/webhooks", json={"url": url, **fields})
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def endpoints(db) -> list[tuple]:
    return db.execute("SELECT id::text, url, secret, event_types, enabled, disabled_reason "
                      "FROM skiplock.webhook_endpoints ORDER BY created_at").fetchall()


def run_task(api, store, outcome="completed", queue="default") -> str:
    """A real transition: submit over HTTP, then claim and settle as a worker would."""
    task_id = api.post("/v1/tasks", json={"kind": "k", "queue": queue}).get_json()["id"]
    [claimed] = store.tasks.task_claim([queue], 1, "test-worker", 30)
    assert str(claimed.id) == task_id
    assert store.tasks.task_settle([Settlement(claimed.id, claimed.lease_token, outcome, result={"ok": 1}, error="boom")]) \
        == {claimed.id: outcome}
    return task_id


# ---- endpoints -------------------------------------------------------------------------------------

def test_register_shows_the_secret_once_and_sends_nothing(api, db, receiver):
    url = receiver.url_for("/hook?x=1")
    r = api.post("/v1/webhooks", json={"url": url, "description": "billing"})
    assert r.status_code == 201, r.get_json()
    created = r.get_json()
    assert r.headers["Location"] == f"/v1/webhooks/{created['id']}"
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert {k: created[k] for k in ("url", "events", "description", "enabled", "disabled_reason", "pending",
                                    "dead")} == {"url": url, "events": ["task.*"], "description": "billing",
                                                 "enabled": True, "disabled_reason": None, "pending": 0,
                                                 "dead": 0}
    [(row_id, row_url, row_secret, row_events, enabled, _)] = endpoints(db)
    assert (row_id, row_url, row_secret, row_events, enabled) == (created["id"], url, created["secret"],
                                                                  ["task.*"], True)
    # never again: not in the list, not in the detail, not in the audit log
    listed = api.get("/v1/webhooks")
    assert listed.status_code == 200
    [item] = listed.get_json()["webhooks"]
    detail = api.get(f"/v1/webhooks/{created['id']}").get_json()
    assert "secret" not in item and "secret" not in detail
    assert item == detail == {k: v for k, v in created.items() if k != "secret"}
    assert created["secret"] not in listed.get_data(as_text=True)
    assert created["secret"] not in str(db.execute("SELECT array_agg(detail::text) FROM skiplock.audit_log")
                                        .fetchone()[0])
    assert audit_rows(db) == [("admin-bot", "webhook.create", created["id"], "ok")]
    assert receiver.log == []  # registering resolves the name, it sends no request

    # a given secret and a list of event types (deduplicated, sorted)
    second = register(api, receiver.url_for("/other"), secret=SECRET,
                      events=["task.failed", "task.completed", "task.failed"])
    assert second["secret"] == SECRET and second["events"] == ["task.completed", "task.failed"]
    assert [e[2] for e in endpoints(db)] == [created["secret"], SECRET]
    assert receiver.log == []


def test_register_with_a_host_name_of_the_allow_list(api, db):
    created = register(api, "http://localhost:9999/hook", events=["task.completed"])
    assert created["url"] == "http://localhost:9999/hook"
    assert count(db, "SELECT count(*) FROM skiplock.webhook_endpoints") == 1


@pytest.mark.parametrize("url, address", [
    ("http://10.0.0.1/hook", "10.0.0.1"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
    ("http://[::1]:8080/hook", "::1"),
    ("http://127.0.0.1:9999/hook", "127.0.0.1"),
    ("https://localhost/hook", "127.0.0.1"),
    ("http://192.168.1.10/", "192.168.1.10"),
    ("http://[::ffff:10.1.2.3]/", "10.1.2.3"),
])
def test_ssrf_guard_refuses_internal_addresses(strict_api, db, url, address):
    r = strict_api.post("/v1/webhooks", json={"url": url})
    status, code, message = error_of(r)
    assert (status, code) == (400, "webhook.address_refused"), message
    assert address in message and "url" in message
    assert count(db, "SELECT count(*) FROM skiplock.webhook_endpoints") == 0
    assert audit_rows(db) == [("admin-bot", "webhook.create", None, "webhook.address_refused")]


def test_allow_list_admits_its_networks_only(make_api, db):  # noqa: F811
    api = make_api(webhook_allowed_networks=LOCAL)
    register(api, "http://127.0.0.1:8080/hook")
    assert error_of(api.post("/v1/webhooks", json={"url": "http://10.0.0.1/"}))[:2] == \
        (400, "webhook.address_refused")
    # a public address needs no allow-list (and, again, nothing is sent to it)
    strict = make_api()
    assert strict.post("/v1/webhooks", json={"url": "https://93.184.216.34/hook"}).status_code == 201
    assert count(db, "SELECT count(*) FROM skiplock.webhook_endpoints") == 2


@pytest.mark.parametrize("body, field", [
    ({"url": "http://127.0.0.1/", "secret_key": "x"}, "secret_key"),
    ({"url": "http://127.0.0.1/", "event": ["task.*"]}, "event"),
    ({}, "url"),
    ({"url": 5}, "url"),
    ({"url": ""}, "url"),
    ({"url": "ftp://127.0.0.1/x"}, "url"),
    ({"url": "http://user:pw@127.0.0.1/"}, "url"),
    ({"url": "http:///nohost"}, "url"),
    ({"url": "http://127.0.0.1/", "events": []}, "events"),
    ({"url": "http://127.0.0.1/", "events": ["task.exploded"]}, "events[0]"),
    ({"url": "http://127.0.0.1/", "events": "task.*"}, "events"),
    ({"url": "http://127.0.0.1/", "secret": "plain-text-secret"}, "secret"),
    ({"url": "http://127.0.0.1/", "secret": "whsec_not*base64"}, "secret"),
    ({"url": "http://127.0.0.1/", "secret": "whsec_c2hvcnQ="}, "secret"),
    ({"url": "http://127.0.0.1/", "description": ["x"]}, "description"),
])
def test_bad_bodies_are_400_naming_the_field(api, db, body, field):
    status, code, message = error_of(api.post("/v1/webhooks", json=body))
    assert (status, code) == (400, "request.invalid"), message
    assert message.startswith(field), message
    if isinstance(body.get("secret"), str):
        assert body["secret"] not in message  # a secret is never echoed (nor audited)
    assert count(db, "SELECT count(*) FROM skiplock.webhook_endpoints") == 0
    assert [r[1:] for r in audit_rows(db)] == [("webhook.create", None, "request.invalid")]


def test_rotate_enable_disable_delete(api, db):
    created = register(api)
    hook = f"/v1/webhooks/{created['id']}"

    rotated = api.post(f"{hook}/rotate-secret")
    assert rotated.status_code == 200
    new = rotated.get_json()["secret"]
    assert new.startswith("whsec_") and new != created["secret"]
    assert endpoints(db)[0][2] == new
    assert rotated.get_json()["id"] == created["id"]
    given = api.post(f"{hook}/rotate-secret", json={"secret": SECRET}).get_json()
    assert given["secret"] == SECRET == endpoints(db)[0][2]
    assert error_of(api.post(f"{hook}/rotate-secret", json={"secret": "nope"}))[:2] == (400, "request.invalid")
    assert endpoints(db)[0][2] == SECRET
    assert "secret" not in api.get(hook).get_json()

    disabled = api.post(f"{hook}/disable", json={"reason": "receiver down"}).get_json()
    assert (disabled["enabled"], disabled["disabled_reason"]) == (False, "receiver down")
    assert api.post(f"{hook}/disable").get_json()["disabled_reason"] == "disabled by admin-bot"
    enabled = api.post(f"{hook}/enable")
    assert enabled.status_code == 200
    assert (enabled.get_json()["enabled"], enabled.get_json()["disabled_reason"]) == (True, None)
    assert api.post(f"{hook}/enable").get_json()["enabled"] is True  # idempotent

    deleted = api.request("DELETE", hook)
    assert (deleted.status_code, deleted.get_data()) == (204, b"")
    assert endpoints(db) == []
    assert api.get("/v1/webhooks").get_json() == {"webhooks": []}

    missing = str(uuid.uuid4())
    for method, path in (("GET", hook), ("DELETE", hook), ("POST", f"{hook}/enable"), ("POST", f"{hook}/disable"),
                         ("POST", f"{hook}/rotate-secret"), ("POST", f"/v1/webhooks/{missing}/redeliver")):
        assert error_of(api.request(method, path))[:2] == (404, "webhook.not_found"), (method, path)
    for method, path in (("GET", "/v1/webhooks/nope"), ("DELETE", "/v1/webhooks/nope"),
                         ("POST", "/v1/webhooks/12/enable")):
        status, code, message = error_of(api.request(method, path))
        assert (status, code) == (400, "request.invalid") and message.startswith("webhook_id"), message

    assert [r[1:] for r in audit_rows(db)] == [
        ("webhook.create", created["id"], "ok"),
        ("webhook.rotate_secret", created["id"], "ok"),
        ("webhook.rotate_secret", created["id"], "ok"),
        ("webhook.rotate_secret", created["id"], "request.invalid"),
        ("webhook.disable", created["id"], "ok"),
        ("webhook.disable", created["id"], "ok"),
        ("webhook.enable", created["id"], "ok"),
        ("webhook.enable", created["id"], "ok"),
        ("webhook.delete", created["id"], "ok"),
        # after the delete: every refusal has its row too (GETs have none)
        ("webhook.delete", created["id"], "webhook.not_found"),
        ("webhook.enable", created["id"], "webhook.not_found"),
        ("webhook.disable", created["id"], "webhook.not_found"),
        ("webhook.rotate_secret", created["id"], "webhook.not_found"),
        ("webhook.redeliver", missing, "webhook.not_found"),
        ("webhook.delete", "nope", "request.invalid"),  # the target as given
        ("webhook.enable", "12", "request.invalid"),
    ]
    details = str(db.execute("SELECT array_agg(detail::text) FROM skiplock.audit_log").fetchone()[0])
    assert all(secret not in details for secret in (created["secret"], new, SECRET))


def test_disabled_endpoint_gets_no_new_deliveries(api, db, store):
    created = register(api)
    api.post(f"/v1/webhooks/{created['id']}/disable")
    api.post("/v1/tasks", json={"kind": "k"})
    assert count(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0
    api.post(f"/v1/webhooks/{created['id']}/enable")
    api.post("/v1/tasks", json={"kind": "k"})
    assert count(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 1


# ---- roles ---------------------------------------------------------------------------------------

def test_every_route_is_admin_only_and_refusals_change_nothing(make_api, db, store):
    api = make_api(webhook_allowed_networks=LOCAL, api_max_auth_failures=0)  # a wrong token per route, more than the throttle allows a minute
    created = register(api)
    run_task(api, store)
    [delivery_id] = [r[0] for r in db.execute("SELECT id FROM skiplock.webhook_deliveries "
                                             "WHERE event_type = 'task.completed'").fetchall()]
    db.execute("UPDATE skiplock.webhook_deliveries SET state = 'dead', attempts = 8 WHERE id = %s", (delivery_id,))
    hook = f"/v1/webhooks/{created['id']}"
    routes = [("GET", "/v1/webhooks", None), ("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9999/x"}),
              ("GET", hook, None), ("DELETE", hook, None), ("POST", f"{hook}/rotate-secret", None),
              ("POST", f"{hook}/enable", None), ("POST", f"{hook}/disable", {"reason": "r"}),
              ("POST", f"{hook}/redeliver", None), ("GET", "/v1/deliveries", None),
              ("GET", f"/v1/deliveries?endpoint_id={created['id']}", None),
              ("POST", f"/v1/deliveries/{delivery_id}/redeliver", None)]

    def snapshot():
        return (endpoints(db), count(db, "SELECT count(*) FROM skiplock.audit_log"),
                db.execute("SELECT id, state, attempts FROM skiplock.webhook_deliveries ORDER BY id").fetchall())

    before = snapshot()
    for method, path, body in routes:
        for role in ("reader", "submitter"):
            r = api.request(method, path, json=body, role=role)
            assert error_of(r)[:2] == (403, "auth.forbidden"), (method, path, role)
            assert "whsec_" not in r.get_data(as_text=True)
        r = api.request(method, path, json=body, role=None)
        assert error_of(r)[:2] == (401, "auth.unauthorized"), (method, path)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        r = api.request(method, path, json=body, role=None, headers={"Authorization": "Bearer wrong"})
        assert error_of(r)[:2] == (401, "auth.unauthorized"), (method, path)
    after = snapshot()
    assert after == before


def test_auth_header_is_checked_before_anything_else(api):
    # no token, bad bodies and bad ids: still 401, nothing about the route's input shows
    assert error_of(api.post("/v1/webhooks", json={"nope": 1}, role=None))[:2] == (401, "auth.unauthorized")
    assert error_of(api.request("DELETE", "/v1/webhooks/not-a-uuid", role=None))[:2] == (401, "auth.unauthorized")
    assert error_of(api.get("/v1/deliveries?state=bogus", role=None))[:2] == (401, "auth.unauthorized")


# ---- deliveries -------------------------------------------------------------------------------------------

def test_deliveries_from_real_transitions_filtered_and_paged(api, db, store):
    everything = register(api, events=["task.*"])
    completed_only = register(api, "http://127.0.0.1:9999/done", events=["task.completed"])
    done = run_task(api, store, "completed")
    failed = run_task(api, store, "failed")

    # task.*: queued, running, completed / queued, running, failed; task.completed: one
    r = api.get("/v1/deliveries")
    assert r.status_code == 200
    page = r.get_json()
    assert page["next_cursor"] is None
    rows = page["deliveries"]
    assert len(rows) == 7
    assert [d["id"] for d in rows] == sorted(d["id"] for d in rows)  # keyset order: by id
    by_endpoint = {}
    for d in rows:
        by_endpoint.setdefault(d["endpoint_id"], []).append((d["payload"]["data"]["task_id"], d["event_type"]))
        assert (d["state"], d["attempts"], d["last_status"], d["delivered_at"]) == ("pending", 0, None, None)
        assert d["payload"]["type"] == d["event_type"]
    assert sorted(by_endpoint[everything["id"]]) == sorted([
        (done, "task.queued"), (done, "task.running"), (done, "task.completed"),
        (failed, "task.queued"), (failed, "task.running"), (failed, "task.failed")])
    assert by_endpoint[completed_only["id"]] == [(done, "task.completed")]
    [only] = api.get(f"/v1/deliveries?endpoint_id={completed_only['id']}").get_json()["deliveries"]
    assert only["payload"]["data"] == {"task_id": done, "kind": "k", "queue": "default", "state": "completed",
                                       "attempt": 1, "seq": 3, "result": {"ok": 1}}
    assert api.get(f"/v1/webhooks/{everything['id']}").get_json()["pending"] == 6

    # state filter
    db.execute("UPDATE skiplock.webhook_deliveries SET state = 'dead', attempts = 8, last_status = 500, "
               "last_error = 'HTTP 500' WHERE event_type IN ('task.failed', 'task.completed')")
    dead = api.get("/v1/deliveries?state=dead").get_json()["deliveries"]
    assert sorted(d["event_type"] for d in dead) == ["task.completed", "task.completed", "task.failed"]
    assert len(api.get(f"/v1/deliveries?state=dead&endpoint_id={everything['id']}").get_json()["deliveries"]) == 2
    assert api.get("/v1/deliveries?state=delivered").get_json()["deliveries"] == []
    assert api.get(f"/v1/deliveries?endpoint_id={uuid.uuid4()}").get_json() == {"deliveries": [], "next_cursor": None}
    assert api.get(f"/v1/webhooks/{everything['id']}").get_json()["dead"] == 2

    # keyset pages of 2: every delivery once, in id order, even with new ones arriving meanwhile
    seen, cursor, pages = [], None, 0
    while True:
        r = api.get("/v1/deliveries?limit=2" + (f"&cursor={cursor}" if cursor else "")).get_json()
        seen += [d["id"] for d in r["deliveries"]]
        pages += 1
        if pages == 1:
            api.post("/v1/tasks", json={"kind": "late"})  # two more deliveries, somewhere in id order
        cursor = r["next_cursor"]
        if cursor is None:
            break
        assert len(r["deliveries"]) == 2
    assert len(seen) == len(set(seen)) and seen == sorted(seen)
    assert {d["id"] for d in rows} <= set(seen)

    # bad queries
    for query, field in (("state=lost", "state"), ("limit=0", "limit"), ("limit=501", "limit"), ("limit=-1", "limit"),
                         ("cursor=abc", "cursor"), ("endpoint_id=1", "endpoint_id"), ("page=2", "page"),
                         ("state=dead&state=pending", "state")):
        status, code, message = error_of(api.get(f"/v1/deliveries?{query}"))
        assert (status, code) == (400, "request.invalid") and message.startswith(field), (query, message)
    assert audit_rows(db, everything["id"]) == [("admin-bot", "webhook.create", everything["id"], "ok")]


def test_redeliver_dead_deliveries(api, db, store):
    endpoint = register(api, events=["task.completed", "task.failed"])
    other = register(api, "http://127.0.0.1:9999/other", events=["task.completed"])
    run_task(api, store, "completed")
    run_task(api, store, "failed")
    rows = {(str(r[1]), r[2]): str(r[0]) for r in db.execute(
        "SELECT id, endpoint_id, event_type FROM skiplock.webhook_deliveries").fetchall()}
    assert len(rows) == 3
    mine_completed = rows[(endpoint["id"], "task.completed")]
    mine_failed = rows[(endpoint["id"], "task.failed")]
    others = rows[(other["id"], "task.completed")]
    db.execute("UPDATE skiplock.webhook_deliveries SET state = 'dead', attempts = 8, last_status = 500, "
               "last_error = 'HTTP 500', next_attempt_at = now() + interval '1 day'")

    # one delivery: dead -> pending with a fresh budget
    r = api.post(f"/v1/deliveries/{mine_completed}/redeliver")
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert (body["id"], body["state"], body["attempts"], body["last_error"]) == (mine_completed, "pending", 0, None)
    state, attempts, due = db.execute("SELECT state, attempts, next_attempt_at <= now() FROM "
                                      "skiplock.webhook_deliveries WHERE id = %s", (mine_completed,)).fetchone()
    assert (state, attempts, due) == ("pending", 0, True)
    # not dead (any more): 409, and nothing changes
    status, code, message = error_of(api.post(f"/v1/deliveries/{mine_completed}/redeliver"))
    assert (status, code) == (409, "delivery.not_dead") and "pending" in message
    missing = str(uuid.uuid4())
    assert error_of(api.post(f"/v1/deliveries/{missing}/redeliver"))[:2] == (404, "delivery.not_found")
    status, code, message = error_of(api.post("/v1/deliveries/not-a-uuid/redeliver"))
    assert (status, code) == (400, "request.invalid") and message.startswith("delivery_id")

    # every dead one of an endpoint (not the other endpoint's)
    r = api.post(f"/v1/webhooks/{endpoint['id']}/redeliver")
    assert (r.status_code, r.get_json()) == (200, {"endpoint_id": endpoint["id"], "redelivered": 1})
    assert db.execute("SELECT state FROM skiplock.webhook_deliveries WHERE id = %s", (mine_failed,)).fetchone()[0] \
        == "pending"
    assert db.execute("SELECT state FROM skiplock.webhook_deliveries WHERE id = %s", (others,)).fetchone()[0] == "dead"
    assert api.post(f"/v1/webhooks/{endpoint['id']}/redeliver").get_json()["redelivered"] == 0

    assert [r[1:] for r in audit_rows(db) if r[1] != "task.submit" and r[1] != "webhook.create"] == [
        ("delivery.redeliver", mine_completed, "ok"),
        ("delivery.redeliver", mine_completed, "delivery.not_dead"),
        ("delivery.redeliver", missing, "delivery.not_found"),
        ("delivery.redeliver", "not-a-uuid", "request.invalid"),
        ("webhook.redeliver", endpoint["id"], "ok"),
        ("webhook.redeliver", endpoint["id"], "ok"),
    ]
    details = db.execute("SELECT detail FROM skiplock.audit_log WHERE action = 'webhook.redeliver' "
                         "ORDER BY id").fetchall()
    assert [d[0] for d in details] == [{"redelivered": 1}, {"redelivered": 0}]


def test_deleting_an_endpoint_deletes_its_deliveries(api, db, store):
    keep = register(api)
    gone = register(api, "http://127.0.0.1:9999/gone")
    api.post("/v1/tasks", json={"kind": "k"})
    assert count(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 2
    assert api.request("DELETE", f"/v1/webhooks/{gone['id']}").status_code == 204
    [left] = api.get("/v1/deliveries").get_json()["deliveries"]
    assert left["endpoint_id"] == keep["id"]
    assert api.request("DELETE", f"/v1/webhooks/{keep['id']}").status_code == 204
    # no endpoint left: the fan-out trigger is off again
    api.post("/v1/tasks", json={"kind": "k"})
    assert count(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0


# ---- the document ------------------------------------------------------------------------------------------

def test_openapi_describes_the_webhook_routes(api):
    paths = api.get("/v1/openapi.json", role=None).get_json()["paths"]
    expected = {"/v1/webhooks": {"get", "post"}, "/v1/webhooks/{webhook_id}": {"get", "delete"},
                "/v1/webhooks/{webhook_id}/rotate-secret": {"post"}, "/v1/webhooks/{webhook_id}/enable": {"post"},
                "/v1/webhooks/{webhook_id}/disable": {"post"}, "/v1/webhooks/{webhook_id}/redeliver": {"post"},
                "/v1/deliveries": {"get"}, "/v1/deliveries/{delivery_id}/redeliver": {"post"}}
    for path, methods in expected.items():
        assert set(paths[path]) == methods, path
        for op in paths[path].values():
            assert op["x-required-role"] == "admin"
            assert {"401", "403"} <= set(op["responses"])

    def props(path, method, status):
        return paths[path][method]["responses"][status]["content"]["application/json"]["schema"]["properties"]

    assert "secret" in props("/v1/webhooks", "post", "201")
    assert "secret" in props("/v1/webhooks/{webhook_id}/rotate-secret", "post", "200")
    assert "secret" not in props("/v1/webhooks/{webhook_id}", "get", "200")
    assert "secret" not in props("/v1/webhooks", "get", "200")["webhooks"]["items"]["properties"]
    create = paths["/v1/webhooks"]["post"]
    assert "webhook.address_refused" in create["responses"]["400"]["description"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["required"] == ["url"]
    redeliver = paths["/v1/deliveries/{delivery_id}/redeliver"]["post"]["responses"]
    assert "delivery.not_dead" in redeliver["409"]["description"]
    assert "delivery.not_found" in redeliver["404"]["description"]

"""`skiplock tokens new` as an operator uses it: the printed entries, given to a real `skiplock api`
as SKIPLOCK_API_TOKENS, let the printed tokens in with their roles, and nothing else gets in.
Also the API's front door: / and /v1/ answer without a token, like the OpenAPI document."""

from __future__ import annotations

import importlib.metadata
import re

import httpx

from tests.acceptance.test_api_process import wait_ready
from tests.acceptance.test_cli import skiplock
from tests.support.harness import free_port, scalar


def new_token(name: str, role: str) -> tuple[str, str]:
    done = skiplock("tokens", "new", "--name", name, "--role", role, url="")
    assert done.returncode == 0, done.stderr
    token = re.search(r"^token: (\S+)", done.stdout, re.M).group(1)
    entry = re.search(r"^entry: (\S+)", done.stdout, re.M).group(1)
    return token, entry


def test_printed_entries_configure_the_api_and_the_printed_tokens_authenticate(processes, db_url, db):
    reader_token, reader_entry = new_token("dashboard", "reader")
    admin_token, admin_entry = new_token("ops", "admin")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = processes.spawn(db_url, "--bind", f"127.0.0.1:{port}", "--workers", "1", command="api",
                          env={"SKIPLOCK_API_TOKENS": f"{reader_entry},{admin_entry}", "SKIPLOCK_LOG_FORMAT": "text"})
    wait_ready(api, base)

    def call(method: str, path: str, token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, base + path, headers=headers, timeout=10)

    assert call("GET", "/v1/queues", reader_token).status_code == 200
    refused = call("POST", "/v1/queues/mail/pause", reader_token)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "auth.forbidden"
    assert "token 'dashboard' has role reader" in refused.json()["error"]["message"]
    assert call("GET", "/v1/queues", None).status_code == 401
    assert call("GET", "/v1/queues", reader_token + "x").status_code == 401
    assert scalar(db, "SELECT count(*) FROM skiplock.pauses") == 0

    paused = call("POST", "/v1/queues/mail/pause", admin_token)
    assert paused.status_code == 200 and paused.json() == {"queue": "mail", "paused": True}
    assert db.execute("SELECT scope, name FROM skiplock.pauses").fetchall() == [("queue", "mail")]
    # the audit log names the token's name, as printed
    assert db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log "
                      "WHERE outcome = 'ok'").fetchall() == [("ops", "queue.pause", "mail", "ok")]

    # the front door needs no token: / sends to the console, /ui/; /v1/ says where everything is
    root = call("GET", "/", None)
    assert (root.status_code, root.headers["Location"]) == (302, "/ui/")
    index = call("GET", "/v1/", None)
    assert index.status_code == 200, index.text
    body = index.json()
    assert (body["name"], body["version"], body["api_version"], body["openapi"]) == \
        ("skiplock", importlib.metadata.version("skiplock"), "1", "/v1/openapi.json")
    assert body["links"] == {"audit": "/v1/audit", "deliveries": "/v1/deliveries", "events": "/v1/events", "kinds": "/v1/kinds",
                             "limits": "/v1/limits",
                             "queues": "/v1/queues", "schedules": "/v1/schedules", "signals": "/v1/signals",
                             "tasks": "/v1/tasks", "webhooks": "/v1/webhooks", "workers": "/v1/workers"}
    for path in body["links"].values():  # every link is a real collection (a token is all it needs)
        assert call("GET", path, admin_token).status_code == 200, path
    assert call("GET", body["openapi"], None).json()["info"]["title"] == "skiplock API"

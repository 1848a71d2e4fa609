"""No secret reaches a log, at DEBUG either: every role runs as a real process with seeded
secrets (a database URL with a password, API tokens, a webhook URL with an access token in its
query, one with userinfo, a webhook secret); a delivery goes out, requests are refused (401,
403, bad query strings, request lines gunicorn refuses itself), and then every role's log is
searched for each secret. gunicorn's own refusals answer in the API's JSON error shape."""

from __future__ import annotations

import hashlib
import json
import secrets
import signal
import socket
import threading
import uuid

import httpx
import psycopg
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tests.support.harness import free_port, wait_exit, wait_for


def _url_with_password(db_url: str, password: str) -> str:
    """db_url as a libpq URL carrying `password` (the test server trusts every password)."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    return (f"postgresql://{info.get('user', 'postgres')}:{password}@{info.get('host', '127.0.0.1')}:"
            f"{info.get('port', 5432)}/{info['dbname']}")


def _raw(port: int, data: bytes) -> tuple[int, dict, bytes]:
    """Send raw bytes; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), {k.lower(): v for k, v in headers.items()}, body


def test_no_role_logs_a_secret(processes, db_url, receiver: HTTPServer):
    seeded = {name: f"{name}-{secrets.token_hex(8)}" for name in
              ("dbpassword", "admintoken", "readertoken", "accesstoken", "hookpassword", "badtoken")}
    from skiplock.engine.webhooks import generate_secret

    webhook_secret = generate_secret()
    seeded["webhooksecret"] = webhook_secret
    seeded["webhookkey"] = webhook_secret.removeprefix("whsec_")
    tokens = ",".join(f"{role}-bot:{role}:{hashlib.sha256(seeded[role + 'token'].encode()).hexdigest()}"
                      for role in ("admin", "reader"))
    env = {"SKIPLOCK_LOG_LEVEL": "DEBUG", "SKIPLOCK_API_TOKENS": tokens, "SKIPLOCK_POLL_SECONDS": "0.2",
           "SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8", "SKIPLOCK_RETENTION_SECONDS": "1"}
    url = _url_with_password(db_url, seeded["dbpassword"])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = processes.spawn(url, "--bind", f"127.0.0.1:{port}", "--workers", "1", command="api", env=env)
    roles = {"api": api, **{role: processes.spawn(url, command=role, env=env)
                            for role in ("worker", "scheduler", "dispatcher")}}

    delivered = threading.Event()

    def hook(request: Request) -> Response:
        delivered.set()
        return Response("", status=200)

    receiver.expect_request("/hook", method="POST").respond_with_handler(hook)
    receiver.expect_request("/failing", method="POST").respond_with_data(
        f"upstream said: token={seeded['accesstoken']}", status=500)

    def ready():
        for name, proc in roles.items():
            assert proc.alive(), f"{name} exited early:\n{proc.log()[-3000:]}"
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 30, message="skiplock api ready")
    admin = {"Authorization": f"Bearer {seeded['admintoken']}"}
    with httpx.Client(base_url=base, timeout=30) as client:
        for path in ("/hook", "/failing"):
            r = client.post("/v1/webhooks", headers=admin, json={
                "url": f"http://127.0.0.1:{receiver.port}{path}?access_token={seeded['accesstoken']}",
                "events": ["task.completed"], "secret": webhook_secret})
            assert r.status_code == 201, r.text
        refused = client.post("/v1/webhooks", headers=admin, json={
            "url": f"http://hook:{seeded['hookpassword']}@127.0.0.1:{receiver.port}/hook", "events": ["task.*"]})
        assert refused.status_code == 400 and seeded["hookpassword"] not in refused.text
        assert client.post("/v1/tasks", headers=admin, json={"kind": "t.noop"}).status_code == 201
        # refusals: no token, a wrong one, a weak one, a secret in a query string
        assert client.get("/v1/tasks").status_code == 401
        assert client.get("/v1/tasks", headers={"Authorization": f"Bearer {seeded['badtoken']}"}).status_code == 401
        assert client.post("/v1/queues/default/pause",
                           headers={"Authorization": f"Bearer {seeded['readertoken']}"}).status_code == 403
        assert client.get(f"/v1/tasks?access_token={seeded['accesstoken']}", headers=admin).status_code == 400
    # an endpoint with userinfo that got into the table past the API's check: the dispatcher refuses it
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO skiplock.webhook_endpoints (id, url, event_types, secret) "
                     "SELECT %s, %s, event_types, secret FROM skiplock.webhook_endpoints LIMIT 1",
                     (uuid.uuid4(), f"http://hook:{seeded['hookpassword']}@127.0.0.1:{receiver.port}/hook"))
    with httpx.Client(base_url=base, timeout=30, headers=admin) as client:
        assert client.post("/v1/tasks", json={"kind": "t.noop"}).status_code == 201

    # gunicorn's own refusals, in the API's error shape (and their request lines kept out of the log)
    query = f"access_token={seeded['accesstoken']}"
    for request, status, code in (
            (f"GET /v1/tasks?{query} HTTP/1.1 extra\r\nHost: x\r\n\r\n", 400, "request.bad_request"),
            (f"GET /v1/tasks?{query}&pad={'x' * 5000} HTTP/1.1\r\nHost: x\r\n\r\n", 414, "request.uri_too_long"),
            (f"GET /v1/tasks?{query} HTTP/1.1\r\nHost: x\r\nX-Big: {'y' * 9000}\r\n\r\n", 431,
             "request.header_fields_too_large")):
        got, headers, body = _raw(port, request.encode())
        assert got == status, body
        assert headers["content-type"] == "application/json"
        assert json.loads(body)["error"]["code"] == code

    wait_for(delivered.is_set, 30, message="a delivery reached the receiver")

    def logged(role: str, text: str):
        return text in roles[role].log()

    wait_for(lambda: logged("dispatcher", "HTTP 500: upstream said"), 30, message="the failing delivery's retry")
    wait_for(lambda: logged("dispatcher", "credentials in the URL are not allowed"), 30,
             message="the dispatcher refusing the endpoint with userinfo")
    for proc in roles.values():
        proc.signal(signal.SIGTERM)
    for name, proc in roles.items():
        assert wait_exit(proc, 30)[0] == 0, f"{name}:\n{proc.log()[-3000:]}"

    logs = {name: proc.log() for name, proc in roles.items()}
    for name, text in logs.items():
        for secret_name, secret in seeded.items():
            assert secret not in text, f"{secret_name} in the {name} log:\n" + "\n".join(
                line for line in text.splitlines() if secret in line)[:2000]
    refusals = [json.loads(line) for line in logs["api"].splitlines()
                if line.startswith("{") and '"request refused"' in line]
    assert {r["code"] for r in refusals} == {"auth.unauthorized", "auth.forbidden"}
    assert all(r["client"] == "127.0.0.1" for r in refusals)
    assert [r["token"] for r in refusals if r["code"] == "auth.forbidden"] == ["reader-bot"]

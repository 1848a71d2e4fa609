"""Input that used to reach a 500, names matched whole, and refusals made traceable: each answer
is a 4xx in the API's error shape, a refused change still leaves its audit row (NUL escaped,
size bounded), and every 401/403 log line names the client (through trusted proxies only) and,
for a 403, the token, counted by token name and route template."""

from __future__ import annotations

import logging

import pytest

from skiplock.api.refusals import client_address, parse_networks
from tests.integration.test_api import TOKENS, api, error_of, make_api  # noqa: F401 (fixtures)
from tests.support.harness import sample, samples_of


def test_an_integer_literal_over_the_digit_limit_is_a_400(api):
    body = '{"kind": "k", "payload": {"n": ' + "9" * 5000 + "}}"
    r = api.post("/v1/tasks", data=body, headers={"Content-Type": "application/json"})
    status, code, message = error_of(r)
    assert (status, code) == (400, "request.invalid") and "digits" in message


@pytest.mark.parametrize("method, path, kwargs, target", [
    ("POST", "/v1/tasks", {"json": {"kind": "k", "\x00": 1}}, None),
    ("POST", "/v1/tasks?\x00=1", {"json": {"kind": "k"}}, None),
    ("POST", "/v1/queues/%00/pause", {}, "\\x00"),
    ("POST", "/v1/kinds/a%00b/pause", {}, "a\\x00b"),
])
def test_a_nul_in_a_refused_change_is_a_400_with_its_audit_row(api, db, method, path, kwargs, target):
    r = api.request(method, path, **kwargs)
    status, code, _ = error_of(r)
    assert (status, code) == (400, "request.invalid"), r.get_data(as_text=True)
    rows = db.execute("SELECT target, outcome, detail->>'message' FROM skiplock.audit_log").fetchall()
    assert len(rows) == 1, rows
    assert rows[0][0] == target and rows[0][1] == "request.invalid"
    assert "\x00" not in rows[0][2]


def test_a_refusals_audit_row_is_bounded(api, db):
    r = api.post("/v1/queues/" + "q" * 5000 + "/pause")
    assert r.status_code == 400
    target, message = db.execute("SELECT target, detail->>'message' FROM skiplock.audit_log").fetchone()
    assert len(target) <= 200 and len(message) <= 500


@pytest.mark.parametrize("name", ["q1\n", "q1\r\n"])
def test_a_name_with_a_trailing_newline_is_refused(api, db, name):
    r = api.post("/v1/tasks", json={"kind": "k", "queue": name})
    assert error_of(r)[:2] == (400, "request.invalid")
    r = api.post("/v1/tasks", json={"kind": name})
    assert error_of(r)[:2] == (400, "request.invalid")
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0


def test_an_idempotency_key_with_a_trailing_newline_is_refused(api, db):
    # past the test client's header check, as a raw client sends it
    r = api.post("/v1/tasks", json={"kind": "k"}, environ_overrides={"HTTP_IDEMPOTENCY_KEY": "order-42\n"})
    assert error_of(r)[:2] == (400, "request.invalid")
    assert db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0] == 0


def test_an_integer_query_value_with_a_trailing_newline_is_refused(api):
    assert error_of(api.get("/v1/tasks?limit=5%0A"))[:2] == (400, "request.invalid")


def test_a_request_id_with_a_trailing_newline_is_replaced(api):
    r = api.get("/v1/tasks", environ_overrides={"HTTP_X_REQUEST_ID": "abc\n"})
    assert r.status_code == 200 and r.headers["X-Request-Id"] != "abc"


# ---- traceable refusals --------------------------------------------------------------------------

def _refusal_lines(caplog):
    return [r for r in caplog.records if r.getMessage() == "request refused"]


def test_a_401_logs_the_client_and_counts_as_unknown(api, caplog):
    caplog.set_level(logging.WARNING, "skiplock.api")
    r = api.client.get("/v1/tasks", headers={"Authorization": "Bearer wrong"},
                       environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert r.status_code == 401
    (line,) = _refusal_lines(caplog)
    assert line.client == "203.0.113.9" and line.route == "/v1/tasks" and not hasattr(line, "token")
    metrics = api.client.get("/metrics").get_data(as_text=True)
    assert sample(samples_of(metrics), "skiplock_api_auth_refusals_total", route="/v1/tasks", status="401",
                  token="unknown") == 1


def test_a_403_logs_the_token_name_and_counts_it_by_route_template(api, caplog):
    caplog.set_level(logging.WARNING, "skiplock.api")
    for _ in range(2):
        r = api.post("/v1/queues/default/pause", role="reader", environ_base={"REMOTE_ADDR": "198.51.100.7"})
        assert r.status_code == 403
    line = _refusal_lines(caplog)[0]
    assert (line.client, line.token, line.route) == ("198.51.100.7", "reader-bot", "/v1/queues/<name>/pause")
    metrics = api.client.get("/metrics").get_data(as_text=True)
    assert sample(samples_of(metrics), "skiplock_api_auth_refusals_total", route="/v1/queues/<name>/pause",
                  status="403", token="reader-bot") == 2


def test_x_forwarded_for_is_believed_from_trusted_proxies_only(make_api, caplog):
    caplog.set_level(logging.WARNING, "skiplock.api")
    api = make_api(api_trusted_proxies=("10.0.0.0/8",))
    forwarded = {"X-Forwarded-For": "192.0.2.66, 203.0.113.5, 10.1.1.1"}
    api.client.get("/v1/tasks", headers=forwarded, environ_base={"REMOTE_ADDR": "10.2.2.2"})
    api.client.get("/v1/tasks", headers=forwarded, environ_base={"REMOTE_ADDR": "198.51.100.1"})
    assert [line.client for line in _refusal_lines(caplog)] == ["203.0.113.5", "198.51.100.1"]


@pytest.mark.parametrize("peer, forwarded, trusted, expected", [
    ("10.0.0.1", "1.2.3.4", (), "10.0.0.1"),                        # no trusted proxy: the peer
    ("10.0.0.1", "1.2.3.4", ("10.0.0.0/8",), "1.2.3.4"),
    ("10.0.0.1", "6.6.6.6, 1.2.3.4", ("10.0.0.0/8",), "1.2.3.4"),   # the client's own entry is not believed
    ("10.0.0.1", "1.2.3.4, 10.0.0.2", ("10.0.0.0/8",), "1.2.3.4"),  # two proxies
    ("10.0.0.1", "garbage", ("10.0.0.0/8",), "10.0.0.1"),
    ("10.0.0.1", None, ("10.0.0.0/8",), "10.0.0.1"),
    ("10.0.0.1", "10.0.0.3", ("10.0.0.0/8",), "10.0.0.3"),          # only proxies: the farthest
    ("2001:db8::1", "2001:db8:1::9", ("2001:db8::/64",), "2001:db8:1::9"),
])
def test_client_address(peer, forwarded, trusted, expected):
    assert client_address(peer, forwarded, parse_networks(trusted)) == expected


def test_the_token_header_never_reaches_the_log(api, caplog):
    caplog.set_level(logging.DEBUG)
    api.client.get("/v1/tasks", headers={"Authorization": "Bearer a-leaked-token"})
    assert "a-leaked-token" not in caplog.text
    assert TOKENS["admin"] not in caplog.text

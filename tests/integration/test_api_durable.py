"""Durable execution through the HTTP API (the real WSGI app, real Postgres, tasks suspended by a
real worker's run): what a waiting task waits for in its view and in lists, a task's step log
with paging, and signals sent (audited, the first send wins, bad input one line, nothing
written) and listed with their cursor."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.test_api import api, audit_rows, count, error_of, make_api  # noqa: F401 (fixtures)
from tests.integration.test_durable import drive, worker  # noqa: F401 (fixture)
from tests.support.suspended import suspend_one_of_each

SIGNALS = "SELECT count(*) FROM skiplock.signals"


def test_a_waiting_task_says_what_it_waits_for_in_its_view_and_in_lists(api, worker, db_url, db):
    ids = suspend_one_of_each(worker, db_url, db)
    shown = {reason: api.get(f"/v1/tasks/{task_id}", role="reader").get_json() for reason, task_id in ids.items()}
    assert {reason: t["state"] for reason, t in shown.items()} == dict.fromkeys(ids, "waiting")
    sleep = shown["sleep"]["waiting_for"]
    assert sleep["reason"] == "sleep" and sleep["until"].endswith("Z")
    signal = shown["signal"]["waiting_for"]
    assert (signal["reason"], signal["signal"]) == ("signal", "order-1.confirmed") and signal["timeout_at"]
    assert shown["tasks"]["waiting_for"] == {"reason": "tasks", "count": 2}
    assert shown["parents"]["waiting_for"] == {"reason": "parents", "count": 1}
    listed = {t["id"]: t["waiting_for"] for t in api.get("/v1/tasks?state=waiting").get_json()["tasks"]}
    assert listed == {task_id: shown[reason]["waiting_for"] for reason, task_id in ids.items()}
    # not waiting: null (the children ctx.enqueue made are queued)
    queued = api.get("/v1/tasks?state=queued").get_json()["tasks"]
    assert len(queued) == 2 and all(t["waiting_for"] is None for t in queued)


def test_the_step_log_in_call_order_with_its_run_and_whole_results_paged(api, worker, db_url, db):
    ids = suspend_one_of_each(worker, db_url, db)
    page = api.get(f"/v1/tasks/{ids['sleep']}/steps", role="reader")
    assert page.status_code == 200, page.get_json()
    steps, next_after = page.get_json()["steps"], page.get_json()["next_after"]
    token = db.execute("SELECT lease_token FROM skiplock.task_events WHERE task_id = %s AND type = 'running'",
                       (ids["sleep"],)).fetchone()[0]
    assert next_after is None
    assert [(s["position"], s["name"], s["occurrence"], s["type"], s["attempt"], s["lease_token"])
            for s in steps] == [(1, "a", 1, "step", 1, token), (2, "sleep", 1, "sleep", 1, token)]
    assert steps[0]["result"] == 1 and set(steps[1]["result"]) == {"until"}
    assert steps[0]["recorded_at"].endswith("Z")
    first = api.get(f"/v1/tasks/{ids['sleep']}/steps?limit=1").get_json()
    assert ([s["name"] for s in first["steps"]], first["next_after"]) == (["a"], 1)
    rest = api.get(f"/v1/tasks/{ids['sleep']}/steps?after=1&limit=1").get_json()
    assert ([s["name"] for s in rest["steps"]], rest["next_after"]) == (["sleep"], None)
    signal_steps = api.get(f"/v1/tasks/{ids['signal']}/steps").get_json()["steps"]
    assert [(s["name"], s["type"]) for s in signal_steps] == [("order-1.confirmed", "signal")]
    # a task without steps: an empty log; no task: 404; no token: 401
    assert api.get(f"/v1/tasks/{ids['parents']}/steps").get_json() == {"steps": [], "next_after": None}
    missing = "00000000-0000-7000-8000-000000000001"
    assert error_of(api.get(f"/v1/tasks/{missing}/steps"))[:2] == (404, "task.not_found")
    assert api.get(f"/v1/tasks/{missing}/steps", role=None).status_code == 401
    status, code, message = error_of(api.get(f"/v1/tasks/{ids['sleep']}/steps?after=-1"))
    assert (status, code) == (400, "request.invalid") and message.startswith("after"), message


def test_a_signal_sent_over_http_wakes_its_waiter_once_and_is_audited(api, worker, db_url, db, store):
    ids = suspend_one_of_each(worker, db_url, db)
    sent = api.post("/v1/signals", json={"name": "order-1.confirmed", "payload": {"by": "warehouse"}},
                    role="submitter")
    assert (sent.status_code, sent.get_json()) == (201, {"name": "order-1.confirmed", "created": True, "woken": 1})
    assert api.get(f"/v1/tasks/{ids['signal']}").get_json()["state"] == "queued"
    again = api.post("/v1/signals", json={"name": "order-1.confirmed", "payload": {"by": "someone else"}})
    assert (again.status_code, again.get_json()) == (200, {"name": "order-1.confirmed", "created": False, "woken": 0})
    assert db.execute("SELECT payload FROM skiplock.signals").fetchall() == [({"by": "warehouse"},)]
    assert audit_rows(db, "order-1.confirmed") == [("submitter-bot", "signal.send", "order-1.confirmed", "ok"),
                                                   ("admin-bot", "signal.send", "order-1.confirmed", "ok")]
    assert drive(worker, store, db, [ids["signal"]]) == {uuid.UUID(ids["signal"]): "completed"}
    assert db.execute("SELECT state, result FROM skiplock.tasks WHERE id = %s", (ids["signal"],)).fetchone() == \
        ("completed", {"got": {"by": "warehouse"}})
    # a payload may be any JSON, or left out (null)
    assert api.post("/v1/signals", json={"name": "bare"}).status_code == 201
    assert api.post("/v1/signals", json={"name": "null", "payload": None}).status_code == 201
    assert api.post("/v1/signals", json={"name": "listed", "payload": [1, 2]}).status_code == 201
    # a reader may list, not send
    assert error_of(api.post("/v1/signals", json={"name": "x"}, role="reader"))[:2] == (403, "auth.forbidden")


@pytest.mark.parametrize("body,status,fragment", [
    ({"name": ""}, 400, "signal name must be 1-200 characters (got 0)"),
    ({"name": "n" * 201}, 400, "signal name must be 1-200 characters (got 201)"),
    ({"name": 7}, 400, "signal name 7: must be a string"),
    ({"payload": {}}, 400, "name: required"),
    ({"name": "ok", "payload": "\u0000"}, 400, "signal payload contains a NUL character"),
    ({"name": "ok", "payload": "x" * 200}, 413, "signal payload is 202 bytes; the limit is 100"),
])
def test_a_bad_signal_is_one_line_and_writes_nothing(make_api, db, body, status, fragment):
    api = make_api(max_payload_bytes=100)
    got_status, code, message = error_of(api.post("/v1/signals", json=body))
    assert got_status == status and fragment in message and "\n" not in message, message
    assert count(db, SIGNALS) == 0
    assert [row[3] for row in audit_rows(db)] == [code]  # the refusal's row


def test_signals_are_listed_newest_first_by_prefix_with_a_cursor(api, db):
    for name in ("order-1.confirmed", "order-2.confirmed", "invoice-1.paid"):
        assert api.post("/v1/signals", json={"name": name, "payload": {"n": name}}).status_code == 201
    listed = api.get("/v1/signals", role="reader").get_json()
    assert [s["name"] for s in listed["signals"]] == ["invoice-1.paid", "order-2.confirmed", "order-1.confirmed"]
    assert listed["next_cursor"] is None and listed["signals"][0]["payload"] == {"n": "invoice-1.paid"}
    first = api.get("/v1/signals?prefix=order-&limit=1").get_json()
    assert [s["name"] for s in first["signals"]] == ["order-2.confirmed"] and first["next_cursor"]
    rest = api.get(f"/v1/signals?prefix=order-&limit=1&cursor={first['next_cursor']}").get_json()
    assert ([s["name"] for s in rest["signals"]], rest["next_cursor"]) == (["order-1.confirmed"], None)
    status, code, message = error_of(api.get("/v1/signals?cursor=bm90LWEtY3Vyc29y"))
    assert (status, code, message) == (400, "request.invalid", "cursor: not a next_cursor of GET /v1/signals")
    assert api.get("/v1/signals", role=None).status_code == 401

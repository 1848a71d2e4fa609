"""Typed payloads (`@task(..., payload=Model)`) with real processes: `skiplock api` with and without
SKIPLOCK_TASKS, and a `skiplock worker` running tests/support/typed_handlers.py.

This test process imports the models but not the typed handlers (and forgets their models if
another test imported them): what it enqueues is enqueued raw, as by a process that does not
know them.
"""

from __future__ import annotations

import httpx

import skiplock
from tests.acceptance.test_api_process import wait_ready
from tests.integration.test_api import TOKEN_CONFIG, TOKENS
from tests.support.harness import free_port, wait_exit, wait_for
from tests.support.typed_models import Order, pydantic_says

SUBMITTER = {"Authorization": f"Bearer {TOKENS['submitter']}"}
ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}
TYPED = "tests.support.typed_handlers"


def said(data, *loc) -> str:
    """pydantic's words for Order's error at `loc` (our framing around them is checked exactly)."""
    return pydantic_says(Order, data, *loc)


def start_api(processes, db_url, **env) -> httpx.Client:
    port = free_port()
    proc = processes.spawn(db_url, "--bind", f"127.0.0.1:{port}", "--workers", "1", command="api",
                           env={"SKIPLOCK_API_TOKENS": TOKEN_CONFIG, **env})
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, base)
    return httpx.Client(base_url=base, headers=SUBMITTER, timeout=30)


def task_count(db) -> int:
    return db.execute("SELECT count(*) FROM skiplock.tasks").fetchone()[0]


def finals(db, ids) -> dict[str, tuple]:
    rows = db.execute("SELECT id::text, state, attempts, result, last_error FROM skiplock.tasks "
                      "WHERE id = ANY(%s::uuid[]) AND state IN ('completed', 'failed')", (list(ids),)).fetchall()
    return {row[0]: row[1:] for row in rows}


def test_typed_kinds_through_the_api_and_a_worker(processes, db_url, db, monkeypatch):
    # another test module of this process may have imported the typed handlers (under xdist they
    # share a process): their models are forgotten here, so what this test enqueues goes in raw
    from skiplock.engine import payload_types
    for kind in ("typed.order", "typed.order_async"):
        monkeypatch.delitem(payload_types.MODELS, kind, raising=False)
    typed_api = start_api(processes, db_url, SKIPLOCK_TASKS=TYPED)
    raw_api = start_api(processes, db_url)

    # the schema endpoint: the API that imported the kinds lists them with their model's schema
    listed = typed_api.get("/v1/kinds")
    assert listed.status_code == 200, listed.text
    schema = Order.model_json_schema()
    assert listed.json() == {"kinds": [
        {"kind": "typed.order", "queue": "default", "max_attempts": 5, "payload_schema": schema},
        {"kind": "typed.order_async", "queue": "default", "max_attempts": 5, "payload_schema": schema}]}
    assert schema["title"] == "Order" and schema["required"] == ["order_id"]
    assert raw_api.get("/v1/kinds").json() == {"kinds": []}
    document = typed_api.get("/v1/openapi.json").json()
    assert set(document["paths"]["/v1/kinds"]) == {"get"}

    # a submission its model refuses: the API's error shape, the message, nothing written
    refused = typed_api.post("/v1/tasks", json={"kind": "typed.order", "payload": {"qty": "many"}})
    assert refused.status_code == 400 and refused.json() == {"error": {"code": "request.invalid", "message": (
        f"payload of typed.order: 2 validation errors for Order: order_id: {said({'qty': 'many'}, 'order_id')}; "
        f"qty: {said({'qty': 'many'}, 'qty')} (input: 'many')")}}
    batch = typed_api.post("/v1/tasks:batch", json={"tasks": [
        {"kind": "typed.order", "payload": {"order_id": 1}},
        {"kind": "typed.order_async", "payload": {"order_id": 2, "address": {"city": "Oslo", "zip": "1"}}}]})
    assert batch.status_code == 400 and batch.json()["error"]["message"] == (
        "tasks[1].payload of typed.order_async: 1 validation error for Order: address.zip: "
        f"{said({'order_id': 2, 'address': {'city': 'Oslo', 'zip': '1'}}, 'address', 'zip')} (input: '1')")
    assert task_count(db) == 0

    # a schedule of a typed kind: its payload is checked when it is saved, not at its first fire
    schedule = {"name": "nightly-order", "kind": "typed.order", "cron": "0 3 * * *"}
    refused = typed_api.post("/v1/schedules", json={**schedule, "payload": {"qty": 2}}, headers=ADMIN)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        f"payload of typed.order: 1 validation error for Order: order_id: {said({'qty': 2}, 'order_id')}")
    assert db.execute("SELECT count(*) FROM skiplock.schedules").fetchone()[0] == 0
    saved = typed_api.post("/v1/schedules", json={**schedule, "payload": {"order_id": "9"}}, headers=ADMIN)
    assert saved.status_code == 201, saved.text
    assert db.execute("SELECT payload FROM skiplock.schedules WHERE name = 'nightly-order'").fetchone()[0] == {
        "order_id": 9, "qty": 1, "address": None, "tags": []}
    # one saved as given by an API that does not know the model: the typed API still lists it
    stored_raw = raw_api.post("/v1/schedules", json={**schedule, "name": "raw-order", "payload": {"qty": "x"}},
                              headers=ADMIN)
    assert stored_raw.status_code == 201, stored_raw.text
    listed = typed_api.get("/v1/schedules", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    assert {s["name"]: s["payload"] for s in listed.json()["schedules"]}["raw-order"] == {"qty": "x"}

    # accepted: stored in the model's JSON form, coerced, defaults filled in
    created = typed_api.post("/v1/tasks", json={"kind": "typed.order", "payload": {
        "order_id": "41", "address": {"city": "Oslo", "zip": "01500"}}})
    assert created.status_code == 201, created.text
    assert created.json()["payload"] == {"order_id": 41, "qty": 1, "address": {"city": "Oslo", "zip": "01500"},
                                         "tags": []}
    typed_async = typed_api.post("/v1/tasks", json={"kind": "typed.order_async", "payload": {"order_id": 43}})
    assert typed_async.status_code == 201, typed_async.text

    # enqueued raw, by processes that did not import the definition: stored as given
    raw = {name: raw_api.post("/v1/tasks", json={"kind": kind, "payload": payload})
           for name, kind, payload in [("good", "typed.order", {"order_id": "42"}),
                                       ("bad", "typed.order", {"order_id": "x"}),
                                       ("bad_async", "typed.order_async", {"tags": "not a list"})]}
    assert {name: r.status_code for name, r in raw.items()} == {"good": 201, "bad": 201, "bad_async": 201}
    assert raw["bad"].json()["payload"] == {"order_id": "x"}
    bad_library = str(skiplock.enqueue(db_url, "typed.order", {"order_id": 7, "qty": -1.5}))
    assert task_count(db) == 6

    ids = {"typed": created.json()["id"], "typed_async": typed_async.json()["id"], "bad_library": bad_library,
           **{name: r.json()["id"] for name, r in raw.items()}}
    processes.spawn(db_url, tasks=TYPED)
    done = wait_for(lambda: (lambda f: f if len(f) == len(ids) else None)(finals(db, ids.values())), 60,
                    message="every task final")
    by_name = {name: done[task_id] for name, task_id in ids.items()}

    received = {"type": "Order", "is_order": True, "qty": 1, "pydantic_loaded": True}
    assert by_name["typed"] == ("completed", 1, {**received, "order_id": 41, "city": "Oslo"}, None)
    assert by_name["typed_async"] == ("completed", 1, {**received, "order_id": 43, "city": None}, None)
    assert by_name["good"] == ("completed", 1, {**received, "order_id": 42, "city": None}, None)
    # refused at run: failed at the first of the kind's 5 attempts, with the validation message
    assert by_name["bad"] == ("failed", 1, None, "payload of typed.order: 1 validation error for Order: order_id: "
                              f"{said({'order_id': 'x'}, 'order_id')} (input: 'x')")
    bad_async = {"tags": "not a list"}
    assert by_name["bad_async"] == ("failed", 1, None, "payload of typed.order_async: 2 validation errors for "
                                    f"Order: order_id: {said(bad_async, 'order_id')}; tags: "
                                    f"{said(bad_async, 'tags')} (input: 'not a list')")
    assert by_name["bad_library"] == ("failed", 1, None, "payload of typed.order: 1 validation error for Order: "
                                      f"qty: {said({'order_id': 7, 'qty': -1.5}, 'qty')} (input: -1.5)")
    retries = db.execute("SELECT count(*) FROM skiplock.task_events WHERE task_id = ANY(%s::uuid[]) "
                         "AND type = 'retrying'", ([ids["bad"], ids["bad_async"], ids["bad_library"]],)).fetchone()[0]
    assert retries == 0


def test_a_worker_without_typed_kinds_never_imports_pydantic(processes, db_url, db):
    task_id = skiplock.enqueue(db_url, "probe.pydantic")
    processes.spawn(db_url, tasks="tests.support.pydantic_probe")
    task = skiplock.wait(db_url, task_id, timeout=60)
    assert (task.state, task.result) == ("completed", {"pydantic_loaded": False})


def test_the_api_refuses_to_start_when_a_task_module_cannot_be_imported(processes, db_url):
    proc = processes.spawn(db_url, "--bind", f"127.0.0.1:{free_port()}", "--workers", "1", command="api",
                           env={"SKIPLOCK_API_TOKENS": TOKEN_CONFIG, "SKIPLOCK_LOG_FORMAT": "text",
                                "SKIPLOCK_TASKS": "tests.support.no_such_tasks"})
    code, _ = wait_exit(proc, 60)
    lines = proc.log().strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("skiplock api: SKIPLOCK_TASKS: cannot import 'tests.support.no_such_tasks'"), lines

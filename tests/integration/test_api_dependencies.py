"""Dependencies through the HTTP API (the real WSGI app, real Postgres): depends_on and
on_parent_failure on POST /v1/tasks and /v1/tasks:batch, refused input as a one-line 400 naming
the field with nothing written, a task's parents and children in its view, the long-poll
(GET /v1/tasks/{id}?wait=) answering once another thread settles the task through the store's
claim and settle, cut at SKIPLOCK_API_MAX_WAIT_SECONDS, refused with 429 beyond
SKIPLOCK_API_MAX_WAITS; and `waiting` in the queue view and the bulk cancel."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from skiplock.engine.model import MAX_PARENTS, Settlement
from tests.integration.test_api import api, count, error_of, make_api  # noqa: F401 (fixtures)

TASKS = "SELECT count(*) FROM skiplock.tasks"
EDGES = "SELECT count(*) FROM skiplock.task_dependencies"


def complete(store, task_id: str, result=None) -> None:
    """Claim the queued task `task_id` and settle it completed, as a worker does."""
    claimed = [c for c in store.tasks.task_claim(["default"], 10, "test-worker", 30) if str(c.id) == task_id]
    assert len(claimed) == 1, claimed
    c = claimed[0]
    assert store.tasks.task_settle([Settlement(c.id, c.lease_token, "completed", result=result)]) == \
        {c.id: "completed"}


def until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_depends_on_makes_a_waiting_task_shown_with_its_parents_and_children(api, db, store):
    parent = api.post("/v1/tasks", json={"kind": "export"}).get_json()
    child = api.post("/v1/tasks", json={"kind": "report", "depends_on": [parent["id"]]}, role="submitter")
    assert child.status_code == 201, child.get_json()
    child = child.get_json()
    assert (child["state"], child["waiting_on"], child["on_parent_failure"]) == ("waiting", 1, "cancel")
    batch = api.post("/v1/tasks:batch", json={"tasks": [
        {"kind": "report", "depends_on": [parent["id"]], "on_parent_failure": "run"},
        {"kind": "plain"}]})
    assert batch.status_code == 201, batch.get_json()
    run_id, plain_id = [t["id"] for t in batch.get_json()["tasks"]]

    shown = api.get(f"/v1/tasks/{parent['id']}", role="reader").get_json()
    assert shown["parents"] == [] and sorted(shown["children"]) == sorted([child["id"], run_id])
    assert (shown["parents_truncated"], shown["children_truncated"]) == (False, False)
    shown = api.get(f"/v1/tasks/{run_id}", role="reader").get_json()
    assert (shown["state"], shown["on_parent_failure"], shown["parents"]) == ("waiting", "run", [parent["id"]])
    plain = api.get(f"/v1/tasks/{plain_id}", role="reader").get_json()
    assert (plain["state"], plain["parents"], plain["children"]) == ("queued", [], [])
    listed = {t["id"]: (t["state"], t["waiting_on"]) for t in api.get("/v1/tasks?state=waiting").get_json()["tasks"]}
    assert listed == {child["id"]: ("waiting", 1), run_id: ("waiting", 1)}
    assert count(db, EDGES) == 2

    complete(store, parent["id"])
    states = {t["id"]: t["state"] for t in api.get("/v1/tasks").get_json()["tasks"]}
    assert (states[child["id"]], states[run_id]) == ("queued", "queued")


def test_a_task_with_more_than_100_parents_shows_100_and_says_so(api, db):
    ids = [t["id"] for t in api.post("/v1/tasks:batch", json={"tasks": [{"kind": "p"}] * 101}).get_json()["tasks"]]
    child = api.post("/v1/tasks", json={"kind": "fan-in", "depends_on": ids}).get_json()
    shown = api.get(f"/v1/tasks/{child['id']}").get_json()
    assert (len(shown["parents"]), shown["parents_truncated"], shown["waiting_on"]) == (100, True, 101)
    assert shown["parents"] == sorted(ids)[:100]
    assert api.get(f"/v1/tasks/{ids[0]}").get_json()["children"] == [child["id"]]


def _too_many() -> list[str]:
    return [str(uuid.UUID(int=i + 1)) for i in range(MAX_PARENTS + 1)]


@pytest.mark.parametrize("depends_on,fragment", [
    ("01a2365a-d721-7078-85a5-889b995af9e1", "depends_on: must be an array, not a string"),
    (["not-an-id"], "depends_on[0] 'not-an-id': not a UUID"),
    ([42], "depends_on[0]: must be a string"),
    ("too many", f"depends_on: must hold 0-{MAX_PARENTS} items (got {MAX_PARENTS + 1})"),
    (["00000000-0000-0000-0000-000000000001"],
     "depends_on: no task 00000000-0000-0000-0000-000000000001 (in schema skiplock)"),
])
def test_bad_depends_on_is_one_line_naming_the_field_and_writes_nothing(api, db, depends_on, fragment):
    parent = api.post("/v1/tasks", json={"kind": "p"}).get_json()["id"]
    depends_on = _too_many() if depends_on == "too many" else depends_on
    for path, body in (("/v1/tasks", {"kind": "k", "depends_on": depends_on}),
                       ("/v1/tasks:batch", {"tasks": [{"kind": "k", "depends_on": [parent]},
                                                      {"kind": "k", "depends_on": depends_on}]})):
        status, code, message = error_of(api.post(path, json=body))
        assert (status, code) == (400, "request.invalid") and fragment in message and "\n" not in message, message
    assert (count(db, TASKS), count(db, EDGES)) == (1, 0)


def test_bad_on_parent_failure_and_a_batch_over_the_parents_bound_write_nothing(api, db):
    parent = api.post("/v1/tasks", json={"kind": "p"}).get_json()["id"]
    status, code, message = error_of(api.post("/v1/tasks", json={"kind": "k", "depends_on": [parent],
                                                                 "on_parent_failure": "maybe"}))
    assert (status, code) == (400, "request.invalid") and message.startswith("on_parent_failure 'maybe'"), message
    half = _too_many()[: MAX_PARENTS // 2 + 1]
    status, code, message = error_of(api.post("/v1/tasks:batch", json={"tasks": [{"kind": "k", "depends_on": half}] * 2}))
    assert (status, code) == (400, "request.invalid") and f"at most {MAX_PARENTS:,} parents in all" in message
    assert (count(db, TASKS), count(db, EDGES)) == (1, 0)


def test_long_poll_answers_once_another_thread_completes_the_task(api, store):
    task_id = api.post("/v1/tasks", json={"kind": "k"}).get_json()["id"]
    done_at = []

    def finish():
        time.sleep(0.5)
        complete(store, task_id, result={"ok": True})
        done_at.append(time.monotonic())

    worker = threading.Thread(target=finish)
    started = time.monotonic()
    worker.start()
    r = api.get(f"/v1/tasks/{task_id}?wait=10", role="reader")
    answered = time.monotonic()
    worker.join()
    body = r.get_json()
    assert (r.status_code, body["state"], body["result"]) == (200, "completed", {"ok": True})
    assert answered - done_at[0] < 0.5 and answered - started < 5


def test_long_poll_ends_at_the_maximum_with_the_task_as_it_is(make_api, db):
    api = make_api(api_max_wait_seconds=1)
    task_id = api.post("/v1/tasks", json={"kind": "k"}).get_json()["id"]
    started = time.monotonic()
    r = api.get(f"/v1/tasks/{task_id}?wait=30")
    elapsed = time.monotonic() - started
    assert (r.status_code, r.get_json()["state"]) == (200, "queued")
    assert 0.9 < elapsed < 3, elapsed
    # a final task answers at once, and wait=0 is a plain read
    db.execute("UPDATE skiplock.tasks SET state = 'cancelled', finished_at = now() WHERE id = %s", (task_id,))
    started = time.monotonic()
    assert api.get(f"/v1/tasks/{task_id}?wait=30").get_json()["state"] == "cancelled"
    assert api.get(f"/v1/tasks/{task_id}?wait=0").status_code == 200
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("wait,fragment", [("soon", "wait 'soon': must be a number"),
                                           ("-1", "wait -1: must be in [0, 3600]"),
                                           ("nan", "wait: must be a finite number")])
def test_a_bad_wait_is_a_one_line_400(api, wait, fragment):
    task_id = api.post("/v1/tasks", json={"kind": "k"}).get_json()["id"]
    status, code, message = error_of(api.get(f"/v1/tasks/{task_id}?wait={wait}"))
    assert (status, code) == (400, "request.invalid") and fragment in message, message


def test_an_unknown_task_is_404_at_once_with_wait(api):
    started = time.monotonic()
    status, code, _ = error_of(api.get(f"/v1/tasks/{uuid.uuid4()}?wait=10"))
    assert (status, code) == (404, "task.not_found") and time.monotonic() - started < 2


def test_waits_beyond_the_bound_answer_429_with_retry_after(make_api, db, store):
    api = make_api(api_max_waits=1)
    task_id = api.post("/v1/tasks", json={"kind": "k"}).get_json()["id"]
    answers = []
    first = threading.Thread(target=lambda: answers.append(api.app.test_client().get(
        f"/v1/tasks/{task_id}?wait=10", headers={"Authorization": "Bearer reader-token"})))
    first.start()
    # the wait has begun once it marked the task watched (its state changes notify from then on)
    until(lambda: db.execute("SELECT watched FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0])
    refused = api.get(f"/v1/tasks/{task_id}?wait=5", role="reader")
    assert error_of(refused)[:2] == (429, "request.rate_limited") and refused.headers["Retry-After"] == "1"
    assert api.get(f"/v1/tasks/{task_id}", role="reader").status_code == 200  # a read without wait still answers
    complete(store, task_id)
    first.join(10)
    assert [(r.status_code, r.get_json()["state"]) for r in answers] == [(200, "completed")]
    # the room is free again
    assert api.get(f"/v1/tasks/{task_id}?wait=5", role="reader").get_json()["state"] == "completed"


def test_waiting_is_counted_per_queue_and_cancelled_in_bulk(api, db):
    parent = api.post("/v1/tasks", json={"kind": "p"}).get_json()["id"]
    for _ in range(3):
        api.post("/v1/tasks", json={"kind": "k", "depends_on": [parent]})
    [queue] = api.get("/v1/queues").get_json()["queues"]
    assert (queue["tasks"]["waiting"], queue["tasks"]["queued"], queue["claimable"]) == (3, 1, 1)
    r = api.post("/v1/tasks:cancel", json={"state": "waiting"})
    assert r.get_json() == {"changed": 3, "limit": 1000}, r.get_json()
    assert db.execute("SELECT state, count(*) FROM skiplock.tasks GROUP BY 1 ORDER BY 1").fetchall() == \
        [("cancelled", 3), ("queued", 1)]


def test_the_document_lists_waiting_and_the_new_fields(api):
    doc = api.get("/v1/openapi.json", role=None).get_json()
    listing = {p["name"]: p for p in doc["paths"]["/v1/tasks"]["get"]["parameters"]}
    assert listing["state"]["schema"]["enum"][0] == "waiting"
    read = doc["paths"]["/v1/tasks/{task_id}"]["get"]
    wait = {p["name"]: p for p in read["parameters"]}["wait"]
    assert wait["in"] == "query" and wait["schema"]["minimum"] == 0
    assert "429" in read["responses"]
    submit = doc["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert submit["properties"]["depends_on"]["maxItems"] == MAX_PARENTS
    assert submit["properties"]["on_parent_failure"]["enum"] == ["cancel", "run"]
    cancel = doc["paths"]["/v1/tasks:cancel"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "waiting" in cancel["properties"]["state"]["enum"]

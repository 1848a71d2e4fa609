"""An enqueue without queue= goes to the queue @task declared (issue 35, a defect): from Python
with the tasks module imported, from ctx.enqueue, over the API when SKIPLOCK_TASKS names the
module, and from `skiplock enqueue` with SKIPLOCK_TASKS; where the definition is not known, to
`default`. A worker whose kinds declare queues it does not claim says so. Real Postgres."""

from __future__ import annotations

import json

import skiplock
import tests.support.handlers  # noqa: F401 - t.note is declared with queue="notes"
from skiplock.engine.metrics import Metrics
from skiplock.engine.registry import REGISTRY
from skiplock.engine.settings import Settings
from skiplock.worker.worker import Worker
from tests.integration.test_cli_limits import run  # noqa: F401 (fixture)
from tests.support.harness import scalar


def queue_of(db, task_id) -> str:
    return scalar(db, "SELECT queue FROM skiplock.tasks WHERE id = %s", (task_id,))


def test_the_library_uses_the_declared_queue_unless_told(db_url, db):
    assert queue_of(db, skiplock.enqueue(db_url, "t.note", {})) == "notes"
    assert queue_of(db, skiplock.enqueue(db_url, "t.note", {}, queue="other")) == "other"
    assert {queue_of(db, i) for i in skiplock.enqueue_many(db_url, "t.note", [{}] * 3)} == {"notes"}
    assert queue_of(db, skiplock.enqueue(db_url, "no.such.definition", {})) == "default"


def test_the_api_uses_the_declared_queue_of_its_tasks_modules(db_url, db):
    from skiplock.api.app import close_app, create_app

    app = create_app(Settings(database_url=db_url, api_auth="disabled", tasks=("tests.support.handlers",)))
    try:
        client = app.test_client()
        answer = client.post("/v1/tasks", json={"kind": "t.note", "payload": {}})
        assert answer.status_code == 201, answer.get_json()
        assert queue_of(db, answer.get_json()["id"]) == "notes"
        answer = client.post("/v1/tasks", json={"kind": "t.note", "payload": {}, "queue": "other"})
        assert queue_of(db, answer.get_json()["id"]) == "other"
        batch = client.post("/v1/tasks:batch", json={"tasks": [{"kind": "t.note"}, {"kind": "unknown.kind"}]})
        assert batch.status_code == 201, batch.get_json()
        queues = [queue_of(db, t["id"]) for t in batch.get_json()["tasks"]]
        assert queues == ["notes", "default"]
    finally:
        close_app(app)


def test_the_cli_uses_the_declared_queue_with_skiplock_tasks(run, db, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_TASKS", "tests.support.handlers")
    code, out, err = run("enqueue", "t.note", "--payload", "{}")
    assert code == 0, err
    assert queue_of(db, out.strip()) == "notes"
    code, out, err = run("enqueue", "t.note", "--payload", "{}", "--queue", "other")
    assert (code, queue_of(db, out.strip())) == (0, "other")


def test_a_worker_says_which_declared_queues_it_does_not_claim(db_url, store):
    worker = Worker(Settings(database_url=db_url, queues=("default",)), store, registry=REGISTRY, metrics=Metrics())
    unclaimed = worker.unclaimed_kinds()
    assert unclaimed["t.note"] == "notes" and "t.noop" not in unclaimed
    claiming = Worker(Settings(database_url=db_url, queues=("default", "notes")), store, registry=REGISTRY,
                      metrics=Metrics())
    assert "t.note" not in claiming.unclaimed_kinds()


def test_a_worker_process_warns_in_one_line_and_ctx_enqueue_uses_the_declared_queue(db_url, db, processes):
    worker = processes.spawn(db_url, tasks="tests.support.handlers", env={"SKIPLOCK_QUEUES": "default",
                                                                         "SKIPLOCK_LOG_FORMAT": "json"})
    processes.wait_ready(worker)
    parent = skiplock.enqueue(db_url, "t.enqueue_note", {})
    result = skiplock.wait(db_url, parent, 20).result
    assert queue_of(db, parent) == "default" and queue_of(db, result) == "notes"
    # the note waits in its queue: this worker does not claim it, and said so when it started
    assert scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (result,)) == "queued"
    warnings = [json.loads(line) for line in worker.log().splitlines()
                if "kinds declare queues this worker does not claim" in line]
    assert len(warnings) == 1
    assert warnings[0]["level"] == "warning" and warnings[0]["kinds"]["t.note"] == "notes"
    assert warnings[0]["queues"] == ["default"]

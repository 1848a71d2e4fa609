"""Diagnosing a failure as an operator does: a real `skiplock worker` fails a task, a real
`skiplock api` shows its traceback (bounded) in the task and its events, the worker's log has one
line for the failure, and every line a handler logs names its task."""

from __future__ import annotations

import json

import httpx

import skiplock
from tests.acceptance.test_api_process import ADMIN, start_api, wait_ready
from tests.support.harness import free_port, scalar, wait_exit, wait_for

HANDLERS = "tests.support.diagnosis_handlers"


def _state(db, task_id) -> str:
    return scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,))


def _json_lines(proc) -> list[dict]:
    return [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]


def test_a_failed_task_shows_its_traceback_and_logs_one_line(processes, db_url, db):
    failing = skiplock.enqueue(db_url, "d.keyerror", {"a": 1})
    deep = skiplock.enqueue(db_url, "d.deep", {"depth": 100})
    worker = processes.spawn(db_url, "--concurrency", "2", tasks=HANDLERS)
    port = free_port()
    api = start_api(processes, db_url, port)
    wait_for(lambda: _state(db, failing) == "failed" and _state(db, deep) == "failed", 30,
             message="both tasks failed")
    wait_ready(api, f"http://127.0.0.1:{port}")

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=ADMIN, timeout=30) as client:
        task = client.get(f"/v1/tasks/{failing}").json()
        events = client.get(f"/v1/tasks/{failing}/events").json()["events"]
        deep_task = client.get(f"/v1/tasks/{deep}").json()
        listed = client.get("/v1/tasks", params={"kind": "d.keyerror"}).json()["tasks"]

    assert (task["state"], task["attempts"], task["last_error"]) == ("failed", 2, "KeyError: 'b'")
    trace = task["last_error_traceback"]
    assert trace.startswith("Traceback (most recent call last):\n")
    assert "in keyerror\n" in trace and "in _lookup\n    return mapping[key]\n" in trace
    assert trace.endswith("KeyError: 'b'\n")
    assert "worker.py" not in trace  # the worker's own call of the handler is the same every time
    assert [e["type"] for e in events] == ["queued", "running", "retrying", "running", "failed"]
    with_traceback = [e for e in events if "traceback" in (e["data"] or {})]
    assert [(e["type"], e["attempt"]) for e in with_traceback] == [("retrying", 1), ("failed", 2)]
    assert all(e["data"]["traceback"] == trace and e["data"]["error"] == "KeyError: 'b'" for e in with_traceback)
    # lists stay small: the traceback is read with one task
    assert [t["last_error_traceback"] for t in listed] == [None]

    deep_trace = deep_task["last_error_traceback"]
    assert len(deep_trace.encode()) <= 8 * 1024
    assert "earlier frames cut ...]" in deep_trace
    assert deep_trace.endswith("RuntimeError: at the bottom\n")

    worker.signal(2)
    assert wait_exit(worker, 30)[0] == 0
    lines = _json_lines(worker)
    failed = [line for line in lines if line["msg"] == "task failed"]
    assert len(failed) == 2
    [one] = [line for line in failed if line["task_id"] == str(failing)]
    assert {k: one[k] for k in ("level", "kind", "queue", "attempts", "error")} == {
        "level": "error", "kind": "d.keyerror", "queue": "default", "attempts": 2, "error": "KeyError: 'b'"}
    # what the handler logged through ctx.log names its task and attempt
    looked_up = [line for line in lines if line["msg"] == "looking up"]
    assert [(line["logger"], line["task_id"], line["kind"], line["queue"], line["attempt"], line["key"])
            for line in looked_up] == [("skiplock.task.d.keyerror", str(failing), "d.keyerror", "default", n, "b")
                                       for n in (1, 2)]
    # and the worker's own lines outside handlers name none
    assert "task_id" not in next(line for line in lines if line["msg"] == "worker stopped")


def test_text_logs_of_async_handlers_name_their_task(processes, db_url, db):
    ids = skiplock.enqueue_many(db_url, "d.async_logs", [{}] * 3)
    worker = processes.spawn(db_url, "--concurrency", "3", tasks=HANDLERS, env={"SKIPLOCK_LOG_FORMAT": "text"})
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == 3, 30,
             message="3 completed")
    worker.signal(2)
    assert wait_exit(worker, 30)[0] == 0
    log = worker.log().splitlines()
    for task_id in ids:
        mine = [line for line in log if f"task_id={task_id} " in line]
        assert len(mine) == 2, log
        assert any("skiplock.task.d.async_logs: async handler says hello" in line for line in mine)
        assert any("some.library: a library logs from inside the handler" in line for line in mine)
        assert all(" kind=d.async_logs queue=default attempt=1" in line for line in mine)


def test_the_api_shows_the_max_attempts_in_force(processes, db_url, db):
    declared = skiplock.enqueue(db_url, "d.seven", {})          # the kind declares 7
    own = skiplock.enqueue(db_url, "d.seven", {}, max_attempts=4)
    port = free_port()
    api = start_api(processes, db_url, port)
    wait_ready(api, f"http://127.0.0.1:{port}")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=ADMIN, timeout=30) as client:
        # before any claim only the task's own value is known: the API imports no handlers
        assert [client.get(f"/v1/tasks/{i}").json()["max_attempts"] for i in (declared, own)] == [None, 4]
        failing = skiplock.enqueue(db_url, "d.keyerror", {})    # the kind declares 2
        worker = processes.spawn(db_url, tasks=HANDLERS)
        wait_for(lambda: (_state(db, declared), _state(db, own), _state(db, failing))
                 == ("completed", "completed", "failed"), 30, message="the three tasks finished")
        shown = {i: client.get(f"/v1/tasks/{i}").json() for i in (declared, own, failing)}
    assert [shown[i]["max_attempts"] for i in (declared, own, failing)] == [7, 4, 2]
    assert (shown[failing]["attempts"], shown[failing]["max_attempts"]) == (2, 2)
    worker.signal(2)
    assert wait_exit(worker, 30)[0] == 0


def test_a_task_failed_by_the_reclaim_logs_one_line(processes, db_url, db):
    """A worker killed mid-task, with no reclaim left: the reclaim (here the other worker's fallback,
    the scheduler's own Reclaimer) fails the task and logs the same one line a handler failure does."""
    env = {"SKIPLOCK_LEASE_SECONDS": 3, "SKIPLOCK_HEARTBEAT_SECONDS": 1, "SKIPLOCK_REAPER_SECONDS": 0.5,
           "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1, "SKIPLOCK_MAX_RECLAIMS": 0}
    task_id = skiplock.enqueue(db_url, "t.record", {"sleep": 60}, queue="lost")
    victim = processes.spawn(db_url, "--queues", "lost", env=env)
    wait_for(lambda: _state(db, task_id) == "running", 20, message="the task to be claimed")
    victim.signal(9)
    assert victim.wait(10) == -9
    survivor = processes.spawn(db_url, "--queues", "other", env=env)
    wait_for(lambda: _state(db, task_id) == "failed", 20, message="the reclaim to fail the task")
    survivor.signal(2)
    assert wait_exit(survivor, 30)[0] == 0
    failed = [line for line in _json_lines(survivor) if line["msg"] == "task failed"]
    assert [{k: line[k] for k in ("level", "task_id", "kind", "queue", "attempts")} for line in failed] == [
        {"level": "error", "task_id": str(task_id), "kind": "t.record", "queue": "lost", "attempts": 1}]
    assert failed[0]["error"].startswith("lease of ") and failed[0]["error"].endswith("expired (reclaim 1)")

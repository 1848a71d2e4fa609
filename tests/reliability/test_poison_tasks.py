"""Poison tasks: a handler that kills its own worker, one that holds the GIL past its lease, and a
payload Postgres cannot store. None of them may stop the queue, run without bound, or answer a 500.

Worker restarts are supervised by the test, as Kubernetes restarts a pod's container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import skiplock
from skiplock.api.app import close_app, create_app
from skiplock.engine.settings import Settings
from tests.support import harness
from tests.support.harness import ROOT, metric, scalar, wait_for

MAX_RECLAIMS = 2
LEASE = 1.5
ENV = {"SKIPLOCK_LEASE_SECONDS": LEASE, "SKIPLOCK_HEARTBEAT_SECONDS": 0.3, "SKIPLOCK_REAPER_SECONDS": 0.3,
       "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 0.5, "SKIPLOCK_MAX_RECLAIMS": MAX_RECLAIMS,
       "SKIPLOCK_POLL_SECONDS": 0.2}


def _task(db, task_id):
    return db.execute("SELECT state, reclaims, last_error, result FROM skiplock.tasks WHERE id = %s",
                      (task_id,)).fetchone()


def _executions(db, task_id) -> list[int]:
    return [pid for (pid,) in db.execute("SELECT pid FROM public.executions WHERE task_id = %s ORDER BY at",
                                         (task_id,)).fetchall()]


@pytest.mark.parametrize("how, exit_code", [("exit", 3), ("segfault", -signal.SIGSEGV)])
def test_a_handler_that_kills_its_worker_is_failed_after_the_reclaim_budget(db_url, db, processes, how, exit_code):
    task_id = skiplock.enqueue(db_url, "t.kill_own_process", {"how": how})
    deaths = []
    worker = processes.spawn(db_url, "--concurrency", "2", env=ENV)

    def supervise():
        """One look, as a kubelet's: restart the worker if it died; done once the task is failed."""
        nonlocal worker
        if not worker.alive():
            deaths.append(worker.popen.returncode)
            worker = processes.spawn(db_url, "--concurrency", "2", env=ENV)
        return _task(db, task_id)[0] == "failed"

    # each round is a worker start, a claim, the death, then a lease running out
    wait_for(supervise, 45, interval=0.1, message="the poison task to be failed")

    state, reclaims, last_error, _ = _task(db, task_id)
    executions = _executions(db, task_id)
    print(f"{how}: executions {len(executions)}, reclaims {reclaims}, worker exits {deaths}; {last_error}")
    # it ran once, then once per reclaim the budget allows, each time in a new process, each
    # time taking its process down; then the next reclaim failed it instead of queueing it
    assert len(executions) == MAX_RECLAIMS + 1 and len(set(executions)) == MAX_RECLAIMS + 1
    assert reclaims == MAX_RECLAIMS + 1
    assert f"(reclaim {MAX_RECLAIMS + 1})" in last_error and "expired" in last_error
    # the last death may not have been seen yet (the task failed after it, at the reclaim)
    wait_for(lambda: supervise() and len(deaths) >= MAX_RECLAIMS + 1, 10, message="every worker death seen")
    assert set(deaths) == {exit_code}, deaths
    # and the queue goes on: the worker that replaced the last one runs the next task
    processes.wait_ready(worker)
    after = skiplock.enqueue(db_url, "t.noop", {})
    wait_for(lambda: _task(db, after)[0] == "completed", 20, message="a healthy task after the poison")
    assert worker.alive() and len(_executions(db, task_id)) == MAX_RECLAIMS + 1


def test_a_handler_holding_the_gil_past_its_lease_loses_it_and_its_outcome_is_refused(db_url, db, processes):
    """libc's sleep through ctypes.PyDLL keeps the GIL for 3 leases: the worker's keeper cannot
    heartbeat, so the lease runs out and another worker reclaims and reruns the task. When the
    call returns, the stuck worker's outcome (or heartbeat) carries a lease token that is no longer
    the task's: the database refuses it, and the refusal is counted."""
    lease = 2
    env = {**ENV, "SKIPLOCK_LEASE_SECONDS": lease, "SKIPLOCK_HEARTBEAT_SECONDS": 0.5}
    held = 3 * lease  # libc's sleep takes whole seconds
    stuck = processes.spawn(db_url, "--concurrency", "2", env=env)
    processes.wait_ready(stuck)
    task_id = skiplock.enqueue(db_url, "t.hold_gil", {"seconds": held})
    wait_for(lambda: _executions(db, task_id), 20, message="the first execution")
    assert _executions(db, task_id) == [stuck.pid]
    healthy = processes.spawn(db_url, "--concurrency", "2", env=env)

    wait_for(lambda: _task(db, task_id)[0] == "completed", 30, message="the task to be completed")
    state, reclaims, _, result = _task(db, task_id)
    executions = _executions(db, task_id)
    assert reclaims == 1 and len(executions) == 2
    # the outcome that stands is the rerun's, not the stuck worker's late one
    assert result == {"pid": executions[1], "held_gil": False}

    def refused():
        return sum(metric(stuck.metrics_port, "skiplock_stale_writes_rejected_total", operation=op) or 0
                   for op in ("completed", "heartbeat"))

    # the stuck worker comes back by itself: its late write is refused and counted, and it stays up
    wait_for(lambda: refused() >= 1, held + 15, message="the stuck worker's stale write to be refused")
    print(f"held the GIL {held} s with a {lease} s lease; reclaims {reclaims}, refused writes {refused()}, "
          f"rerun by {'the healthy worker' if executions[1] == healthy.pid else 'the stuck worker'}")
    assert stuck.alive() and healthy.alive()
    assert harness.http_status(stuck.metrics_port, "/readyz") == 200
    assert _task(db, task_id)[3] == result


NUL_PAYLOAD = '{"text": "a\\u0000b"}'  # JSON's escape of U+0000, which Postgres's jsonb refuses


def test_a_nul_in_a_payload_is_one_line_at_enqueue_in_the_cli_and_the_api(db_url, db, processes):
    worker = processes.spawn(db_url, env=ENV)  # were a task stored, it would be claimed and seen
    done = subprocess.run([sys.executable, "-m", "skiplock.cli", "enqueue", "t.noop", "--payload", NUL_PAYLOAD],
                          env={**os.environ, "SKIPLOCK_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)},
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("skiplock enqueue: ") and "NUL" in lines[0], lines

    app = create_app(Settings(database_url=db_url, api_auth="disabled"))
    try:
        client = app.test_client()
        for path, body in (("/v1/tasks", f'{{"kind": "t.noop", "payload": {NUL_PAYLOAD}}}'),
                           ("/v1/tasks:batch", f'{{"tasks": [{{"kind": "t.noop"}}, '
                                               f'{{"kind": "t.noop", "payload": {NUL_PAYLOAD}}}]}}')):
            response = client.post(path, data=body, content_type="application/json")
            error = response.get_json()["error"]
            assert response.status_code == 400, (path, response.status_code, error)
            assert "\n" not in error["message"] and "payload" in error["message"], error
    finally:
        close_app(app)

    processes.wait_ready(worker)
    # nothing was stored, so nothing is stuck: the next task runs, and it is the only one
    after = skiplock.enqueue(db_url, "t.noop", {})
    wait_for(lambda: _task(db, after)[0] == "completed", 20, message="the next task")
    assert harness.state_counts(db) == {"completed": 1}
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id <> %s", (after,)) == 0
    assert json.loads(NUL_PAYLOAD)["text"] == "a\x00b"

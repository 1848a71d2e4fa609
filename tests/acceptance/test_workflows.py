"""Workflows with real worker processes (issue 21): a chain runs in order and each step reads its
parent's result; a failed parent cancels its dependent or lets it run; skiplock.wait returns
soon after a task ends."""

from __future__ import annotations

import time

import psycopg

import skiplock
from tests.support.harness import scalar, wait_for


def started(db, task_id):
    return scalar(db, "SELECT min(at) FROM public.executions WHERE task_id = %s", (task_id,))


def test_a_chain_runs_in_order_and_reads_its_parents(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "4")
    processes.wait_ready(worker)
    a = skiplock.enqueue(db_url, "t.value", {"n": 7})
    b = skiplock.enqueue(db_url, "t.parents", {}, depends_on=[a])
    c = skiplock.enqueue(db_url, "t.parents", {}, depends_on=[b])
    done = skiplock.wait(db_url, c, 30)
    assert done.state == "completed"
    assert started(db, a) < started(db, b) < started(db, c)
    assert scalar(db, "SELECT result FROM skiplock.tasks WHERE id = %s", (b,))["sum"] == 7
    assert done.result["parents"] == 1 and done.result["states"] == ["completed"]


def test_a_failed_parent_cancels_one_dependent_and_lets_the_other_run(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "4")
    processes.wait_ready(worker)
    parent = skiplock.enqueue(db_url, "t.always_fails", {})
    cancelled = skiplock.enqueue(db_url, "t.parents", {}, depends_on=[parent])
    runs = skiplock.enqueue(db_url, "t.parents", {}, depends_on=[parent], on_parent_failure="run")
    assert skiplock.wait(db_url, runs, 30).result["states"] == ["failed"]
    assert skiplock.wait(db_url, cancelled, 5).state == "cancelled"
    assert scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s", (cancelled,)) == 0


def test_wait_returns_within_milliseconds_of_completion(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "8")
    processes.wait_ready(worker)
    lags = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i in range(200):
            # a task that runs a little while: the wait is in place before it ends
            task_id = skiplock.enqueue(conn, "t.record", {"sleep": 0.02 + (i % 5) * 0.01})
            done = skiplock.wait(conn, task_id, 10)
            returned = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            assert done.state == "completed"
            # finished_at: the outcome's transaction's start; its commit comes a little after
            lags.append((returned - done.finished_at).total_seconds())
    lags.sort()
    p99 = lags[int(len(lags) * 0.99) - 1]
    print(f"wait: from the completion's commit to the return, p50 {lags[100] * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms")
    # the issue's 50 ms is a figure for the benchmarks' quiet machine (RESULTS.md); here, on a
    # shared CI machine, the check is that a notification woke every wait: the fallback read comes
    # only after a second
    assert p99 < 0.5
    start = time.monotonic()
    task_id = skiplock.enqueue(db_url, "t.record", {"sleep": 5})
    try:
        skiplock.wait(db_url, task_id, 0.3)
    except TimeoutError as exc:
        assert "is still" in str(exc)
    else:
        raise AssertionError("wait did not time out")
    assert time.monotonic() - start < 2

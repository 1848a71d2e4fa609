"""A real `skiplock worker` process against a real Postgres: it runs every task once, shows it in
its metrics, and wakes on NOTIFY (also after its LISTEN connection was cut by the server)."""

from __future__ import annotations

import shutil
import subprocess

import skiplock
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for


def _completed(db) -> int:
    return scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")


def test_seed_experiment_200_tasks_on_8_threads_each_run_exactly_once(db_url, db, processes):
    ids = skiplock.enqueue_many(db_url, "t.record", [{"sleep": 0.002, "i": i} for i in range(200)])
    worker = processes.spawn(db_url, "--concurrency", "8")
    processes.wait_ready(worker)

    wait_for(lambda: _completed(db) == 200, 30, message="200 completed tasks")

    assert harness.state_counts(db) == {"completed": 200}
    assert scalar(db, "SELECT count(*) FROM public.executions") == 200
    assert scalar(db, "SELECT count(DISTINCT task_id) FROM public.executions") == 200
    duplicates = db.execute("SELECT task_id, count(*) FROM public.executions GROUP BY task_id "
                            "HAVING count(*) > 1").fetchall()
    assert duplicates == []
    assert set(r[0] for r in db.execute("SELECT task_id FROM public.executions")) == set(ids)
    # one worker, first attempt, no lease lost along the way
    assert db.execute("SELECT DISTINCT pid, attempt FROM public.executions").fetchall() == [(worker.pid, 1)]
    assert db.execute("SELECT sum(attempts), sum(reclaims) FROM skiplock.tasks").fetchone() == (200, 0)
    # every task has exactly queued -> running -> completed
    assert db.execute("SELECT count(*), array_agg(DISTINCT types) FROM (SELECT string_agg(type, ',' ORDER BY seq) "
                      "AS types FROM skiplock.task_events GROUP BY task_id) e").fetchone() == \
        (200, ["queued,running,completed"])
    assert worker.alive()


def test_metrics_endpoint_health_readiness_counters_and_valid_exposition(db_url, db, processes):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (Debian package 'prometheus': apt-get install prometheus)"

    worker = processes.spawn(db_url, "--concurrency", "4")
    processes.wait_ready(worker)
    port = worker.metrics_port
    assert harness.http_status(port, "/healthz") == 200
    assert harness.http_status(port, "/readyz") == 200
    assert harness.http_status(port, "/no-such-page") == 404

    skiplock.enqueue_many(db_url, "t.record", [{"sleep": 0.001}] * 25)
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 5)
    wait_for(lambda: _completed(db) == 30, 30, message="30 completed tasks")

    # the counters are bumped right after the outcome is written: wait for them, with a deadline
    wait_for(lambda: metric(port, "skiplock_tasks_finished_total", outcome="completed") == 30, 10,
             message="30 completed in skiplock_tasks_finished_total")
    samples = harness.scrape(port)
    assert metric(samples, "skiplock_tasks_claimed_total", queue="default") == 30
    assert metric(samples, "skiplock_tasks_finished_total", queue="default", kind="t.record",
                  outcome="completed") == 25
    assert metric(samples, "skiplock_tasks_finished_total", queue="default", kind="t.noop",
                  outcome="completed") == 5
    assert metric(samples, "skiplock_listener_healthy", role="worker") == 1
    assert metric(samples, "skiplock_worker_inflight") == 0
    assert metric(samples, "skiplock_task_duration_seconds_count", kind="t.record") == 25
    assert metric(samples, "skiplock_task_wait_seconds_count", queue="default") == 30
    assert not metric(samples, "skiplock_stale_writes_rejected_total")
    assert not metric(samples, "skiplock_task_reclaims_total")

    body = harness.metrics_text(port)
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, f"promtool check metrics failed:\n{check.stdout}\n{check.stderr}"
    assert harness.http_status(port, "/readyz") == 200


def _listener_backends(db) -> list[tuple[int, str]]:
    """Backends of this database opened by a worker's listener (it names itself)."""
    return db.execute(
        "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'skiplock-listener' ORDER BY backend_start").fetchall()


def _pickup_seconds(db_url, db) -> float:
    """Enqueue one task to the idle worker; return created -> handler-started, on the DB clock."""
    task_id = skiplock.enqueue(db_url, "t.record", {"sleep": 0})
    return wait_for(lambda: scalar(db, "SELECT extract(epoch FROM e.at - t.created_at)::float8 "
                                       "FROM public.executions e JOIN skiplock.tasks t ON t.id = e.task_id "
                                       "WHERE e.task_id = %s", (task_id,)),
                    10, interval=0.02, message=f"task {task_id} to start")


def test_wakeup_on_notify_and_after_the_listen_connection_is_killed(db_url, db, processes):
    # polling every 30 s: a pickup within a second can only come from LISTEN/NOTIFY
    worker = processes.spawn(db_url, "--concurrency", "4", env={"SKIPLOCK_POLL_SECONDS": "30"})
    processes.wait_ready(worker)
    port = worker.metrics_port
    wait_for(lambda: metric(port, "skiplock_listener_healthy", role="worker") == 1, 10,
             message="listener healthy")

    latencies = [_pickup_seconds(db_url, db) for _ in range(3)]
    assert max(latencies) < 1.0, latencies

    (old_pid, old_query), = wait_for(lambda: _listener_backends(db), 10, message="the listener's backend")
    assert len(_listener_backends(db)) == 1, _listener_backends(db)
    assert scalar(db, "SELECT pg_terminate_backend(%s)", (old_pid,)) is True

    def reconnected():
        backends = _listener_backends(db)
        return (len(backends) == 1 and backends[0][0] != old_pid
                and metric(port, "skiplock_listener_healthy", role="worker") == 1)

    wait_for(reconnected, 20, message="the listener to reconnect on a new backend")
    log = worker.log()
    assert "listener connection lost" in log and "listener reconnected" in log

    # the first pickup may ride on the reconnect's catch-up poll; the next ones need NOTIFY
    latencies = [_pickup_seconds(db_url, db) for _ in range(3)]
    assert max(latencies[1:]) < 1.0, latencies
    assert worker.alive()
    wait_for(lambda: harness.state_counts(db) == {"completed": 6}, 10, message="the 6 tasks completed")


def test_claims_fill_only_free_slots_while_the_writer_records_outcomes(db_url, db, processes):
    """A worker claims while its writer records outcomes, each on a connection of its own: it
    claims only into free slots, so every task starts as soon as it is claimed, its handlers
    never overlap more than SKIPLOCK_CONCURRENCY, and every slot gets used."""
    ids = skiplock.enqueue_many(db_url, "t.span", [{"sleep": 0.3, "i": i} for i in range(24)])
    worker = processes.spawn(db_url, "--concurrency", "3")
    wait_for(lambda: _completed(db) == 24, 30, message="24 completed tasks")
    spans = """
        WITH spans AS (
            SELECT task_id, min(at) FILTER (WHERE note = 'start') AS s, max(at) FILTER (WHERE note = 'end') AS e
            FROM public.executions GROUP BY task_id)"""
    # the most executions in progress at any one moment: at each start, those begun and not ended
    assert scalar(db, spans + """
        SELECT max((SELECT count(*) FROM spans b WHERE b.s <= a.s AND b.e > a.s)) FROM spans a""") == 3
    # claimed -> started: a task claimed beyond the free slots would wait for a handler (0.3 s)
    waits = [r[0] for r in db.execute(spans + """
        SELECT extract(epoch FROM spans.s - ev.at)::float8 FROM spans
        JOIN skiplock.task_events AS ev ON ev.task_id = spans.task_id AND ev.type = 'running'""")]
    assert len(waits) == 24 and max(waits) < 0.2, sorted(waits)[-3:]
    assert scalar(db, "SELECT count(*) FROM public.executions WHERE note = 'start'") == 24
    assert set(r[0] for r in db.execute("SELECT DISTINCT task_id FROM public.executions")) == set(ids)
    # the worker's own connections: one for claims, one for outcomes
    assert sorted(r[0] for r in db.execute(
        "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'skiplock-worker-%'")) == \
        ["skiplock-worker-claims", "skiplock-worker-outcomes"]
    assert worker.alive()


def test_a_retry_due_at_once_runs_again_without_waiting_for_the_poll(db_url, db, processes):
    # polling every 30 s: a second run within seconds can only come from the writer telling the
    # claimer that its outcome put the task back in the queue
    worker = processes.spawn(db_url, "--concurrency", "4", env={"SKIPLOCK_POLL_SECONDS": "30"})
    processes.wait_ready(worker)
    task_id = skiplock.enqueue(db_url, "t.retry_later", {"delay": 0})
    wait_for(lambda: _completed(db) == 1, 10, message="the retried task completed")
    assert scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s", (task_id,)) == 2
    assert db.execute("SELECT result, attempts FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone() == \
        ("second time lucky", 2)


def test_a_slot_freed_by_a_lost_claim_is_claimed_into_at_once(db_url, db, processes):
    # one slot, polling every 30 s: the heartbeat that finds the claim lost must wake the claimer
    worker = processes.spawn(db_url, "--concurrency", "1", env={
        "SKIPLOCK_POLL_SECONDS": "30", "SKIPLOCK_LEASE_SECONDS": "6", "SKIPLOCK_HEARTBEAT_SECONDS": "0.5"})
    processes.wait_ready(worker)
    lost = skiplock.enqueue(db_url, "t.cancellable", {"sleep": 60})
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions") == 1, 10, message="the first task running")
    waiting = skiplock.enqueue(db_url, "t.record", {})
    # another claimer took the task over (a newer lease token): this worker's claim is lost
    db.execute("UPDATE skiplock.tasks SET lease_token = nextval('skiplock.lease_tokens'), "
               "lease_owner = 'someone-else' WHERE id = %s", (lost,))
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (waiting,)) == "completed", 5,
             message="the waiting task ran in the freed slot")
    assert scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s", (waiting,)) == 1
    # the lost claim's late outcome was dropped, not written over the new owner's claim
    assert db.execute("SELECT state, lease_owner FROM skiplock.tasks WHERE id = %s", (lost,)).fetchone() == \
        ("running", "someone-else")
    assert metric(worker.metrics_port, "skiplock_stale_writes_rejected_total", operation="heartbeat") == 1.0

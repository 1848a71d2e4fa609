"""Every role through a PgBouncer of the test's own (tests/support/pgbouncer.py), in session mode
and in transaction mode.

Session mode changes nothing for skiplock: a drain, a schedule tick and a webhook delivery pass
through it. Transaction mode hands each transaction to any server connection, so nothing may
outlive one: with SKIPLOCK_DATABASE_POOLER=transaction the enqueuers and the API prepare no
statement and set nothing per session, and a worker polls (SKIPLOCK_LISTEN=false) or listens on a
direct connection (SKIPLOCK_LISTEN_DATABASE_URL)."""

from __future__ import annotations

import pytest

import skiplock
from skiplock.api.app import close_app, create_app
from skiplock.engine.settings import Settings
from skiplock.engine.webhooks import generate_secret
from tests.support import harness
from tests.support.harness import metric, scalar, wait_exit, wait_for
from tests.support.pgbouncer import PgBouncer

ENV = {"SKIPLOCK_POLL_SECONDS": "0.2", "SKIPLOCK_REAPER_SECONDS": "1", "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": "1",
       "SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8", "SKIPLOCK_GAUGES_SECONDS": "1"}
TASKS = 300  # far past psycopg's prepare_threshold (5) for every statement a worker repeats


@pytest.fixture
def bouncer(db_url, tmp_path):
    started = []

    def start(mode: str) -> PgBouncer:
        started.append(PgBouncer(db_url, tmp_path / f"pgbouncer-{mode}", mode).start())
        return started[-1]

    yield start
    for b in started:
        b.stop()


def _completed(db, kind: str) -> int:
    return scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = %s AND state = 'completed'", (kind,))


def _api(url: str, pooler: str):
    return create_app(Settings(database_url=url, api_auth="disabled", database_pooler=pooler,
                               webhook_allowed_networks=("127.0.0.0/8",)))


def test_session_mode_every_role_a_drain_a_schedule_tick_and_a_webhook(db_url, db, processes, bouncer, receiver):
    via = bouncer("session").url
    env = {**ENV, "SKIPLOCK_DATABASE_POOLER": "session"}
    skiplock.enqueue_many(via, "t.record", [{}] * TASKS)
    worker = processes.spawn(via, "--concurrency", "8", env=env)
    wait_for(lambda: _completed(db, "t.record") == TASKS, 60, interval=0.2, message="the drain")
    assert metric(worker.metrics_port, "skiplock_listener_healthy", role="worker") == 1

    # then a schedule and a webhook, made through the API, fired and delivered by their roles
    receiver.expect_request("/hook", method="POST").respond_with_data("")
    app = _api(via, "session")
    try:
        client = app.test_client()
        made = client.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/hook",
                                                 "events": ["task.completed"], "secret": generate_secret()})
        assert made.status_code == 201, made.get_json()
        schedule = client.post("/v1/schedules", json={"name": "tick", "kind": "t.noop", "interval_seconds": 1})
        assert schedule.status_code == 201, schedule.get_json()
    finally:
        close_app(app)
    roles = [processes.spawn(via, command="scheduler", env=env), processes.spawn(via, command="dispatcher", env=env)]
    wait_for(lambda: _completed(db, "t.noop") >= 1, 30, message="a schedule tick's task, run")
    wait_for(lambda: len(receiver.log) >= 1, 30, message="a webhook delivery of its completion")
    for role in roles:
        processes.wait_ready(role)
    assert worker.alive() and all(role.alive() for role in roles)


def test_transaction_mode_enqueuers_api_and_a_polling_worker(db_url, db, processes, bouncer, monkeypatch):
    via = bouncer("transaction").url
    monkeypatch.setenv("SKIPLOCK_DATABASE_POOLER", "transaction")
    # the enqueuers: one task, then batches on one connection (COPY above its threshold, inserts below)
    skiplock.enqueue(via, "t.record", {})
    for _ in range(10):
        skiplock.enqueue_many(via, "t.record", [{}] * 10)
    skiplock.enqueue_many(via, "t.record", [{}] * (TASKS - 101))
    # the API: every statement of a submission and of a listing, many times over on its pool
    app = _api(via, "transaction")
    try:
        client = app.test_client()
        for n in range(20):
            made = client.post("/v1/tasks", json={"kind": "t.record", }, headers={"Idempotency-Key": f"k{n % 10}"})
            assert made.status_code in (200, 201), made.get_json()
            listed = client.get("/v1/tasks?limit=5")
            assert listed.status_code == 200, listed.get_json()
        assert client.get("/readyz").status_code == 200
    finally:
        close_app(app)
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks") == TASKS + 10

    # a worker that only polls: its claims, heartbeats and outcomes carry no session state
    env = {**ENV, "SKIPLOCK_DATABASE_POOLER": "transaction", "SKIPLOCK_LISTEN": "false",
           "SKIPLOCK_HEARTBEAT_SECONDS": "0.5", "SKIPLOCK_LEASE_SECONDS": "5"}
    polling = processes.spawn(via, "--concurrency", "8", env=env)
    processes.wait_ready(polling)
    wait_for(lambda: _completed(db, "t.record") == TASKS + 10, 60, interval=0.2, message="the polling drain")
    assert metric(polling.metrics_port, "skiplock_listener_healthy", role="worker") is None

    # one that listens on a direct connection: woken by notifications, claiming through the pooler
    listening = processes.spawn(via, "--concurrency", "8", env={**env, "SKIPLOCK_LISTEN": "true",
                                                                 "SKIPLOCK_LISTEN_DATABASE_URL": db_url})
    processes.wait_ready(listening)
    wait_for(lambda: metric(listening.metrics_port, "skiplock_listener_healthy", role="worker") == 1, 20,
             message="the direct LISTEN connection")
    skiplock.enqueue_many(via, "t.record", [{"sleep": 0.01}] * 100)
    wait_for(lambda: _completed(db, "t.record") == TASKS + 110, 60, interval=0.2, message="the second drain")
    assert harness.state_counts(db) == {"completed": TASKS + 110}
    assert polling.alive() and listening.alive()
    for worker in (polling, listening):
        assert "does not exist" not in worker.log(), worker.log()[-3000:]


def test_transaction_mode_refuses_a_worker_that_would_listen_through_it(db_url, processes, bouncer):
    via = bouncer("transaction").url
    worker = processes.spawn(via, env={**ENV, "SKIPLOCK_DATABASE_POOLER": "transaction"})
    code, _ = wait_exit(worker, 30)
    assert code != 0
    assert "SKIPLOCK_LISTEN=false" in worker.log() and "Traceback" not in worker.log(), worker.log()[-2000:]

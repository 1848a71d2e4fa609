"""Backends killed: every skiplock backend of the test's database is ended with
pg_terminate_backend every 500 ms for STORM seconds while a worker drains a steady stream of
tasks, the scheduler fires an interval schedule every second, and the dispatcher delivers a
webhook for every completion. Nothing is lost: every task completes (a task runs again only
after a reclaim), every nominal time of the schedule is fired exactly once, every delivery
reaches the receiver; the worker's listener is healthy again within LISTENER_BOUND of the storm's
end and the scheduler fires again within SCHEDULER_BOUND.

The database is the test's own; only backends of that database whose application_name starts
with 'skiplock' are ended (never another test's)."""

from __future__ import annotations

import collections
import datetime as dt
import threading
import time

import skiplock
from skiplock.api.app import close_app, create_app
from skiplock.engine.settings import Settings
from skiplock.engine.webhooks import generate_secret
from tests.support import harness
from tests.support.fault_handlers import executions
from tests.support.harness import metric, scalar, wait_for
from tests.support.sizes import sized
from tests.support.webhook_receiver import Receiver

STORM = sized(8, 20)  # seconds of kills
KILL_EVERY = 0.5
# the bounds stated in docs/OPERATIONS.md
LISTENER_BOUND = 5.0
SCHEDULER_BOUND = 3.0  # a tick is due every second; one failed tick's retry comes within a second
INTERVAL = 1.0
ENV = {"SKIPLOCK_LEASE_SECONDS": 4, "SKIPLOCK_HEARTBEAT_SECONDS": 1, "SKIPLOCK_REAPER_SECONDS": 1,
       "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1, "SKIPLOCK_POLL_SECONDS": 0.5,
       "SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8", "SKIPLOCK_WEBHOOK_LEASE_SECONDS": 3,
       "SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS": 2}

KILL = """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name LIKE 'skiplock%%' AND pid <> pg_backend_pid()"""


class Storm:
    """Ends every skiplock backend of the database each KILL_EVERY seconds until stopped."""

    def __init__(self, db):
        self.db, self.killed, self.rounds = db, 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="storm", daemon=True)

    def _run(self) -> None:
        while not self.done.wait(KILL_EVERY):
            self.killed += scalar(self.db, KILL)
            self.rounds += 1


class Stream:
    """Enqueues a batch of t.noted tasks every `every` seconds until stopped (the enqueuer's own
    connections are not skiplock's and are never ended)."""

    def __init__(self, url: str, batch: int, every: float):
        self.url, self.batch, self.every = url, batch, every
        self.ids: list = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="stream", daemon=True)

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self.ids += skiplock.enqueue_many(self.url, "t.noted", [{"sleep": 0.02}] * self.batch)


def _listener(worker) -> float | None:
    try:
        return metric(worker.metrics_port, "skiplock_listener_healthy", role="worker")
    except OSError:
        return None


def test_backends_killed_every_500ms_lose_nothing(db_url, db, processes, receiver, tmp_path):
    hooks = Receiver()
    receiver.expect_request("/hook", method="POST").respond_with_handler(hooks)
    app = create_app(Settings(database_url=db_url, api_auth="disabled", webhook_allowed_networks=("127.0.0.0/8",)))
    try:
        client = app.test_client()
        made = client.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/hook",
                                                 "events": ["task.completed"], "secret": generate_secret()})
        assert made.status_code == 201, made.get_json()
        # every nominal time fires (catch-up all, overlap allow): a tick a storm held up is fired late,
        # never dropped, so each one can be counted
        made = client.post("/v1/schedules", json={"name": "tick", "kind": "t.noted", "interval_seconds": INTERVAL,
                                                  "catchup": "all", "overlap": "allow"})
        assert made.status_code == 201, made.get_json()
    finally:
        close_app(app)

    worker = processes.spawn(db_url, "--concurrency", "8", env={**ENV, "SKIPLOCK_TEST_EXECUTIONS_DIR": tmp_path},
                             tasks="tests.support.fault_handlers")
    scheduler = processes.spawn(db_url, command="scheduler", env=ENV)
    dispatcher = processes.spawn(db_url, command="dispatcher", env=ENV)
    for proc in (worker, scheduler, dispatcher):
        processes.wait_ready(proc)
    wait_for(lambda: _listener(worker) == 1, 10, message="the worker's listener")
    skiplock.enqueue_many(db_url, "t.noted", [{"sleep": 0.02}] * 100)

    storm, stream = Storm(db), Stream(db_url, batch=10, every=0.25)
    storm.thread.start(), stream.thread.start()
    time.sleep(STORM)  # the fault's length: the storm runs while the roles work
    storm.done.set(), stream.done.set()
    storm.thread.join(5), stream.thread.join(30)
    ended, ended_at = time.monotonic(), harness.db_clock(db)

    wait_for(lambda: _listener(worker) == 1, LISTENER_BOUND + 10, interval=0.05, message="the listener back")
    listener_back = round(time.monotonic() - ended, 2)
    first_fire = wait_for(lambda: scalar(db, "SELECT min(at) FROM skiplock.schedule_fires WHERE at > %s",
                                         (ended_at,)), SCHEDULER_BOUND + 15, interval=0.05,
                          message="the scheduler's first fire after the storm")
    fired_after = round((first_fire - ended_at).total_seconds(), 2)

    total = 100 + len(stream.ids)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind = 't.noted' AND "
                                "idempotency_key IS NULL AND state = 'completed'") == total, 60, interval=0.2,
             message=f"all {total} streamed tasks completed")
    # the schedule has caught up past the storm, and its ticks' tasks ran
    wait_for(lambda: scalar(db, "SELECT last_fire_at >= %s FROM skiplock.schedules WHERE name = 'tick'",
                            (ended_at,)), 15, message="the schedule caught up")
    scheduler.signal(15)
    assert scheduler.wait(15) == 0
    wait_for(lambda: set(harness.state_counts(db)) == {"completed"}, 30, interval=0.2, message="every task completed")
    completed = scalar(db, "SELECT count(*) FROM skiplock.tasks")
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'")
             == completed, 60, interval=0.2, message="every delivery delivered")

    # every task ran, and ran again only after a reclaim
    ran = executions(tmp_path)
    rows = [(str(i), reclaims, ran.get(str(i), 0)) for i, reclaims in db.execute("SELECT id, reclaims FROM skiplock.tasks")]
    assert [r for r in rows if r[2] == 0] == [], "tasks that never ran"
    assert [r for r in rows if r[2] - 1 > r[1]] == [], "a task ran again with no reclaim"
    reclaims = sum(r[1] for r in rows)

    # every nominal time from the first fire to the last fired exactly once, with one task of its key
    fires = db.execute("SELECT nominal_at, outcome, task_id FROM skiplock.schedule_fires WHERE schedule = 'tick' "
                       "ORDER BY nominal_at").fetchall()
    assert {f[1] for f in fires} == {"fired"}, collections.Counter(f[1] for f in fires)
    steps = {(b[0] - a[0]).total_seconds() for a, b in zip(fires, fires[1:])}
    assert steps == {INTERVAL}, f"a nominal time was skipped: gaps {sorted(steps)}"
    keys = dict(db.execute("SELECT idempotency_key, count(*) FROM skiplock.tasks WHERE idempotency_key LIKE "
                           "'schedule:tick:%' GROUP BY 1").fetchall())
    assert len(keys) == len(fires) and set(keys.values()) == {1}
    assert {str(f[2]) for f in fires} == {str(i) for (i,) in db.execute(
        "SELECT id FROM skiplock.tasks WHERE idempotency_key LIKE 'schedule:tick:%'")}
    during = scalar(db, "SELECT count(*) FROM skiplock.schedule_fires WHERE at BETWEEN %s AND %s",
                    (ended_at - dt.timedelta(seconds=STORM), ended_at))

    # every delivery reached the receiver, at least once (duplicates share their webhook-id)
    event_ids = {str(r[0]) for r in db.execute("SELECT event_id FROM skiplock.webhook_deliveries")}
    assert len(event_ids) == completed
    assert set(hooks.received) == event_ids
    duplicates = len(hooks.received) - len(event_ids)

    print(f"storm {STORM} s: {storm.rounds} rounds, {storm.killed} backends ended; tasks {completed} "
          f"({total} streamed), reclaims {reclaims}; schedule fires {len(fires)} ({during} during the storm); "
          f"deliveries {len(event_ids)} (+{duplicates} duplicates); listener back after {listener_back} s; "
          f"scheduler's first fire {fired_after} s after the storm")
    assert storm.killed >= storm.rounds, "the storm ended nothing: nothing was tested"
    assert listener_back <= LISTENER_BOUND
    assert fired_after <= SCHEDULER_BOUND
    assert worker.alive() and dispatcher.alive()

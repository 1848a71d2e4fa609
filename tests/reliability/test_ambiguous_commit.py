"""Ambiguous commits: the connection drops after a COMMIT (or an autocommit statement) reached
Postgres and before its answer came back, so the client cannot tell whether it was applied (it
was). tests/support/lost_answer_proxy.py forwards the chosen statement, lets the server commit
it, and resets the client's connection instead of forwarding the answer.

- An enqueue whose commit answer is lost raises ConnectionLost, saying the task may be stored;
  enqueued again with the same idempotency key, it returns the stored task's id: one task. The
  API's POST /v1/tasks answers 503, and the retry with the same Idempotency-Key replays it.
- A worker whose outcome write loses its answer writes it again: the fence refuses the repeat,
  and the worker sees that the claim's outcome stands, so it counts a completion, not a stale
  write. The same for a handler's own transaction (ctx.transaction()), whose writes commit once.
- A scheduler whose tick loses its commit answer fires the next time: each nominal time has one
  task, none is fired twice and none is lost.

Every role connects through the proxy to the test's own database; the assertions read it
directly."""

from __future__ import annotations

import collections
import datetime as dt

import psycopg
import pytest

import skiplock
from skiplock.api.app import close_app, create_app
from skiplock.engine.errors import ConnectionLost
from skiplock.engine.settings import Settings
from tests.support import harness
from tests.support.fault_handlers import executions
from tests.support.harness import metric, scalar, wait_for
from tests.support.lost_answer_proxy import LostAnswerProxy, Statement
from tests.support.sizes import sized

CUTS = sized(1, 5)  # answers lost per scenario
ENV = {"SKIPLOCK_LEASE_SECONDS": 5, "SKIPLOCK_HEARTBEAT_SECONDS": 1, "SKIPLOCK_REAPER_SECONDS": 1,
       "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1, "SKIPLOCK_POLL_SECONDS": 0.5}


@pytest.fixture
def proxy(db_url):
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    with LostAnswerProxy(int(info.get("port") or 5432), info.get("host") or "127.0.0.1") as p:
        yield p


def _commit_of(application: str, text: str):
    """A COMMIT by `application` of a transaction that ran a statement containing `text`."""
    def chosen(s: Statement) -> bool:
        return s.commit and s.application_name.startswith(application) and any(text in t for t in s.transaction)
    return chosen


def test_an_enqueue_retried_with_its_idempotency_key_makes_one_task(db_url, db, proxy):
    via = proxy.url(db_url)
    for n in range(CUTS):
        key = f"order-{n}"
        proxy.cut(_commit_of("", "INSERT INTO skiplock.tasks"))
        with pytest.raises(ConnectionLost, match="may or may not be stored"):
            skiplock.enqueue(via, "t.noop", {"n": n}, idempotency_key=key)
        # the commit was applied although the caller saw an error
        assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE idempotency_key = %s", (key,)) == 1
        task_id = skiplock.enqueue(via, "t.noop", {"n": n}, idempotency_key=key)
        assert scalar(db, "SELECT id FROM skiplock.tasks WHERE idempotency_key = %s", (key,)) == task_id
    assert len(proxy.cuts) == CUTS

    # the API: 503, then the retry with the same Idempotency-Key replays the stored task
    app = create_app(Settings(database_url=via, api_auth="disabled"))
    try:
        client = app.test_client()
        for n in range(CUTS):
            key = f"api-{n}"
            proxy.cut(_commit_of("skiplock-api", "INSERT INTO skiplock.tasks"))
            first = client.post("/v1/tasks", json={"kind": "t.noop", "payload": {"n": n}},
                                headers={"Idempotency-Key": key})
            assert first.status_code == 503, first.get_json()
            again = client.post("/v1/tasks", json={"kind": "t.noop", "payload": {"n": n}},
                                headers={"Idempotency-Key": key})
            assert again.status_code == 200, again.get_json()  # a replay: the first attempt's task
            assert again.get_json()["id"] == str(scalar(db, "SELECT id FROM skiplock.tasks WHERE "
                                                            "idempotency_key = %s", (key,)))
    finally:
        close_app(app)
    assert len(proxy.cuts) == 2 * CUTS
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks") == 2 * CUTS
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE type = 'queued'") == 2 * CUTS
    print(f"enqueues whose commit answer was lost: {CUTS} by skiplock.enqueue, {CUTS} by the API; "
          f"tasks stored: {2 * CUTS}, one per key")


def _completed_once(db, ids) -> None:
    """Each task completed, with the events of one run and nothing more, and nothing left running."""
    rows = db.execute("SELECT t.state, array_agg(e.type ORDER BY e.seq) FROM skiplock.tasks t "
                      "JOIN skiplock.task_events e ON e.task_id = t.id WHERE t.id = ANY(%s) GROUP BY t.id, t.state",
                      (list(ids),)).fetchall()
    assert collections.Counter((state, tuple(events)) for state, events in rows) == \
        {("completed", ("queued", "running", "completed")): len(ids)}
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'running'") == 0


def test_a_worker_whose_outcome_answer_is_lost_completes_each_task_once(db_url, db, proxy, processes, tmp_path):
    via = proxy.url(db_url)
    worker = processes.spawn(via, "--concurrency", "4", env={**ENV, "SKIPLOCK_TEST_EXECUTIONS_DIR": tmp_path},
                             tasks="tests.support.fault_handlers")
    processes.wait_ready(worker)

    # the writer's outcomes: one autocommit statement each batch, on the outcomes connection
    proxy.cut(lambda s: s.application_name == "skiplock-worker-outcomes" and "settle_input" in s.text, CUTS)
    ids = skiplock.enqueue_many(db_url, "t.noted", [{}] * 20)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == len(ids), 30,
             message="every task completed")
    wait_for(lambda: len(proxy.cuts) == CUTS, 10, message="the outcome answers cut")

    # a handler's own transaction: its writes and its outcome commit together, the answer is lost
    proxy.cut(_commit_of("skiplock-worker", "public.ledger"), CUTS)
    ledger = [skiplock.enqueue(db_url, "t.ledger", {}) for _ in range(CUTS)]
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")
             == len(ids) + CUTS, 30, message="the ledger tasks completed")
    assert len(proxy.cuts) == 2 * CUTS

    _completed_once(db, ids + ledger)
    ran = executions(tmp_path)
    assert all(ran.get(str(i)) == 1 for i in ids), "a task ran twice"
    assert dict(db.execute("SELECT task_id, count(*) FROM public.ledger GROUP BY 1").fetchall()) == \
        {i: 1 for i in ledger}
    # the repeats found their outcomes written: every completion counted, none refused as stale
    def counted():
        return (metric(worker.metrics_port, "skiplock_tasks_finished_total", outcome="completed") or 0,
                metric(worker.metrics_port, "skiplock_stale_writes_rejected_total") or 0)
    wait_for(lambda: sum(counted()) == len(ids) + CUTS, 10, message="the worker's count of its outcomes")
    completed, refused = counted()
    assert (completed, refused) == (len(ids) + CUTS, 0)
    assert worker.alive()
    print(f"outcome answers lost: {CUTS} batches of the writer, {CUTS} handler transactions; "
          f"{len(ids) + CUTS} tasks completed once each; stale writes counted: {refused:g}")


def test_a_schedule_tick_whose_commit_answer_is_lost_fires_each_time_once(db_url, db, proxy, processes):
    via = proxy.url(db_url)
    scheduler = processes.spawn(via, command="scheduler", env=ENV)
    processes.wait_ready(scheduler)
    proxy.cut(_commit_of("skiplock-scheduler", "schedule_fires"), CUTS)
    app = create_app(Settings(database_url=db_url, api_auth="disabled"))
    try:
        # every nominal time fires (catch-up all, overlap allow), so each can be counted
        made = app.test_client().post("/v1/schedules", json={"name": "tick", "kind": "t.noop", "interval_seconds": 1,
                                                              "catchup": "all", "overlap": "allow"})
        assert made.status_code == 201, made.get_json()
    finally:
        close_app(app)
    wait_for(lambda: len(proxy.cuts) == CUTS, 30, message="the ticks' commit answers cut")
    cut_at = harness.db_clock(db)
    wait_for(lambda: scalar(db, "SELECT last_fire_at > %s FROM skiplock.schedules WHERE name = 'tick'",
                            (cut_at + dt.timedelta(seconds=1),)), 15, message="fires after the last cut")
    scheduler.signal(15)
    assert scheduler.wait(15) == 0

    fires = db.execute("SELECT nominal_at, outcome, task_id FROM skiplock.schedule_fires WHERE schedule = 'tick' "
                       "ORDER BY nominal_at").fetchall()
    assert {f[1] for f in fires} == {"fired"}
    steps = {(b[0] - a[0]).total_seconds() for a, b in zip(fires, fires[1:])}
    assert steps == {1.0}, f"a nominal time was skipped: gaps {sorted(steps)}"
    keys = dict(db.execute("SELECT idempotency_key, count(*) FROM skiplock.tasks GROUP BY 1").fetchall())
    assert len(keys) == len(fires) and set(keys.values()) == {1}
    assert {f[2] for f in fires} == {i for (i,) in db.execute("SELECT id FROM skiplock.tasks")}
    log = scheduler.log()
    assert log.count("database unavailable; retrying") >= CUTS, log[-3000:]
    print(f"tick commits whose answer was lost: {CUTS}; nominal times fired {len(fires)}, "
          f"tasks {len(keys)}, one per nominal time")

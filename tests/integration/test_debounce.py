"""Debounce (issue 34, section 3): a burst of enqueues of one key ends in one run, with the last
payload, after the burst settles (delay) or at the first enqueue + max_wait; a started task takes
no more merges. Race-free through tasks_debounce: 10,000 enqueues of one key from 8 threads over
five bursts, with a real worker draining, end in five runs, each with its burst's last payload."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

import skiplock
import tests.support.handlers  # noqa: F401 - registers the t.* kinds
from skiplock import Debounce
from skiplock.engine.errors import InvalidInput
from skiplock.engine.metrics import Metrics
from skiplock.engine.registry import REGISTRY
from skiplock.engine.settings import Settings
from skiplock.worker.worker import Worker
from tests.integration.test_api import make_api, api  # noqa: F401 - fixtures
from tests.support.handlers import note
from tests.support.harness import wait_for

BURSTS = 5
PER_BURST = 2000
THREADS = 8
DELAY = 1.0


@pytest.fixture
def worker(db_url, store, monkeypatch):
    monkeypatch.setenv("SKIPLOCK_DATABASE_URL", db_url)  # the t.* handlers record through it
    settings = Settings(database_url=db_url, concurrency=2, poll_seconds=0.05, queues=("notes",))
    w = Worker(settings, store, registry=REGISTRY, metrics=Metrics())
    running = threading.Thread(target=w.run, name="worker")  # claims while the bursts enqueue
    running.start()
    yield w
    w.stop.set()
    running.join(30)


def runs(db) -> list[dict]:
    return [json.loads(n) for (n,) in db.execute("SELECT note FROM public.executions ORDER BY at").fetchall()]


def test_ten_thousand_enqueues_in_five_bursts_make_five_runs_with_the_last_payloads(db_url, db, worker):
    errors: list = []
    debounce = Debounce("report", delay=DELAY, max_wait=60)

    def burst(b: int, t: int) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                # every merge of one key updates one row, so the enqueues of a key commit one after
                # another: at this machine's WAL flush time that is a few hundred a second. Not
                # waiting for the flush lets a burst be a burst; the race is the same.
                conn.execute("SET synchronous_commit = off")
                for n in range(PER_BURST // THREADS - (1 if t == 0 else 0)):
                    note.enqueue(conn, {"burst": b, "thread": t, "n": n}, debounce=debounce)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    started, gaps = time.monotonic(), []
    for b in range(BURSTS):
        threads = [threading.Thread(target=burst, args=(b, t)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # the burst's last enqueue, alone: its payload is the one that must run
        last = note.enqueue(db_url, {"burst": b, "last": True}, debounce=debounce)
        assert not last.created  # merged into the task the burst made
        settled = time.monotonic()
        wait_for(lambda: len(runs(db)) == b + 1, 30, message=f"burst {b}'s run")
        gaps.append(time.monotonic() - settled)
    elapsed = time.monotonic() - started
    assert errors == []
    assert runs(db) == [{"burst": b, "last": True} for b in range(BURSTS)]
    # a run is recorded by its handler before its outcome commits: the last one may still be writing
    wait_for(lambda: db.execute("SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM skiplock.tasks "
                                "WHERE kind = 't.note'").fetchone() == (BURSTS, BURSTS), 30,
             message="every run's outcome written")
    enqueueing = elapsed - sum(gaps)
    print(f"{BURSTS * PER_BURST} debounced enqueues in {enqueueing:.1f}s of bursts ({elapsed:.1f}s in all): "
          f"{len(runs(db))} runs")


def test_the_start_moves_with_each_enqueue_but_never_past_max_wait(db_url, db):
    d = Debounce("k", delay=30, max_wait=45)
    first = skiplock.enqueue(db_url, "t.note", {"n": 1}, queue="notes", debounce=d)
    start1, until = db.execute("SELECT run_after - created_at, debounce_until - created_at FROM skiplock.tasks "
                               "WHERE id = %s", (first,)).fetchone()
    assert round(start1.total_seconds()) == 30 and round(until.total_seconds()) == 45
    db.execute("UPDATE skiplock.tasks SET created_at = created_at - interval '20 seconds', "
               "debounce_until = debounce_until - interval '20 seconds' WHERE id = %s", (first,))
    second = skiplock.enqueue(db_url, "t.note", {"n": 2}, queue="notes", debounce=d, priority=5)
    assert second == first and not second.created
    payload, priority, start = db.execute("SELECT payload, priority, run_after - created_at FROM skiplock.tasks "
                                          "WHERE id = %s", (first,)).fetchone()
    # now + 30 s would be 50 s after the first enqueue: cut to its 45
    assert (payload, priority, round(start.total_seconds())) == ({"n": 2}, 5, 45)
    # another key, another queue or another kind is another task
    assert skiplock.enqueue(db_url, "t.note", {}, queue="notes", debounce=Debounce("j", 30)).created
    assert skiplock.enqueue(db_url, "t.note", {}, queue="other", debounce=d).created
    assert skiplock.enqueue(db_url, "t.noop", {}, debounce=d).created


def test_a_started_task_takes_no_merge(db_url, db):
    d = Debounce("k", delay=0)
    first = skiplock.enqueue(db_url, "t.note", {"n": 1}, queue="notes", debounce=d)
    db.execute("UPDATE skiplock.tasks SET state = 'running', started_at = now() WHERE id = %s", (first,))
    second = skiplock.enqueue(db_url, "t.note", {"n": 2}, queue="notes", debounce=d)
    assert second.created and second != first
    db.execute("UPDATE skiplock.tasks SET state = 'queued' WHERE id = %s", (first,))  # a retry: started once
    assert skiplock.enqueue(db_url, "t.note", {"n": 3}, queue="notes", debounce=d) == second
    assert db.execute("SELECT payload FROM skiplock.tasks WHERE id = %s", (first,)).fetchone()[0] == {"n": 1}


def test_enqueue_many_merges_each_payload_into_the_one_before(db_url, db):
    ids = skiplock.enqueue_many(db_url, "t.note", [{"n": n} for n in range(100)], queue="notes",
                                debounce=Debounce("k", 5))
    assert len(set(ids)) == 1 and [i.created for i in ids] == [True] + [False] * 99
    assert db.execute("SELECT payload FROM skiplock.tasks").fetchall() == [({"n": 99},)]


def test_the_api_merges_with_200(api, db):
    body = {"kind": "t.note", "queue": "notes", "payload": {"n": 1}, "debounce": {"key": "k", "delay": 5}}
    first = api.post("/v1/tasks", role="submitter", json=body)
    again = api.post("/v1/tasks", role="submitter", json={**body, "payload": {"n": 2}})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.get_json()["id"] == first.get_json()["id"] and again.get_json()["payload"] == {"n": 2}
    bad = api.post("/v1/tasks", role="submitter", json={**body, "delay": 3})
    assert bad.status_code == 400 and "give no delay" in bad.get_json()["error"]["message"]
    missing = api.post("/v1/tasks", role="submitter", json={**body, "debounce": {"key": "k"}})
    assert missing.status_code == 400 and "debounce.delay" in missing.get_json()["error"]["message"]


def test_bad_debounce_options_are_one_line_errors():
    with pytest.raises(InvalidInput, match="max_wait 1: must be >= delay"):
        Debounce("k", delay=5, max_wait=1)
    with pytest.raises(InvalidInput, match="debounce key"):
        Debounce("", delay=1)
    with pytest.raises(InvalidInput, match="does not combine with an idempotency key"):
        skiplock.enqueue("postgresql://nowhere", "t.noop", {}, debounce=Debounce("k", 1), idempotency_key="x")
    with pytest.raises(InvalidInput, match="unique or debounce, not both"):
        skiplock.enqueue("postgresql://nowhere", "t.noop", {}, debounce=Debounce("k", 1), unique=skiplock.Unique())

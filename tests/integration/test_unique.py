"""Unique windows (issue 34, section 2): one task per key among its states, race-free through the
tasks_unique index (16 threads x 1,000 enqueues of 50 keys: 50 tasks, also through enqueue_many
and the API), fixed windows of the database's clock, the states a task blocks in, retention that
keeps a blocking task until its window ends, a resume refused while another task holds the key,
the CLI's flags and a plain enqueue's statements left as they were."""

from __future__ import annotations

import random
import threading

import psycopg
import pytest
from prometheus_client import REGISTRY, generate_latest

import skiplock
from skiplock import Unique
from skiplock.engine.errors import InvalidInput, TaskNotResumable
from skiplock.engine.metrics import enqueue_duplicates
from skiplock.engine.task_actions import TaskFilter, bulk, resume_task
from tests.integration.test_api import make_api, api  # noqa: F401 - fixtures
from tests.support.harness import sample, samples_of

KEYS = 50
THREADS = 16
PER_THREAD = 1000


def count(db, sql="SELECT count(*) FROM skiplock.tasks", params=None) -> int:
    return db.execute(sql, params).fetchone()[0]


def _run_threads(target, n=THREADS) -> list:
    barrier, errors = threading.Barrier(n), []

    def run(i):
        try:
            barrier.wait()
            target(i)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return errors


def test_sixteen_threads_of_a_thousand_enqueues_of_fifty_keys_make_fifty_tasks(db_url, db):
    seen: dict[int, set] = {k: set() for k in range(KEYS)}
    created, lock = [], threading.Lock()

    def enqueue(i):
        keys = [(i + n) % KEYS for n in range(PER_THREAD)]
        random.Random(i).shuffle(keys)
        with psycopg.connect(db_url, autocommit=True) as conn:
            for k in keys:
                task_id = skiplock.enqueue(conn, "t.noop", {"k": k, "n": i}, unique=Unique(by_payload=["k"]))
                with lock:
                    seen[k].add(task_id)
                    created.append(task_id.created)

    assert _run_threads(enqueue) == []
    assert count(db) == KEYS
    assert sum(created) == KEYS and len(created) == THREADS * PER_THREAD
    assert all(len(ids) == 1 for ids in seen.values())  # every enqueue of a key got the one task's id
    enqueue_duplicates()  # registered at the first duplicate; the count is this process's
    counted = sample(samples_of(generate_latest(REGISTRY).decode()), "skiplock_enqueue_duplicates_total",
                     kind="t.noop")
    assert counted >= THREADS * PER_THREAD - KEYS


def test_fifty_keys_through_enqueue_enqueue_many_and_the_api_at_once_make_fifty_tasks(db_url, db, api):
    unique = {"by_payload": False, "payload_keys": ["k"]}

    def enqueue(i):
        keys = [(i + n) % KEYS for n in range(PER_THREAD)]
        random.Random(i).shuffle(keys)
        if i % 3 == 0:
            with psycopg.connect(db_url, autocommit=True) as conn:
                for k in keys:
                    skiplock.enqueue(conn, "t.noop", {"k": k}, unique=Unique(by_payload=["k"]))
        elif i % 3 == 1:  # batches of 25, inside a transaction of the caller's
            with psycopg.connect(db_url) as conn:
                for start in range(0, PER_THREAD, 25):
                    skiplock.enqueue_many(conn, "t.noop", [{"k": k} for k in keys[start:start + 25]],
                                          unique=Unique(by_payload=["k"]))
                    conn.commit()
        else:
            client = type(api)(api.app)
            for start in range(0, PER_THREAD, 25):
                r = client.post("/v1/tasks:batch", role="submitter", json={"tasks": [
                    {"kind": "t.noop", "payload": {"k": k}, "unique": unique} for k in keys[start:start + 25]]})
                assert r.status_code in (200, 201), r.get_json()

    assert _run_threads(enqueue) == []
    assert count(db) == KEYS
    assert count(db, "SELECT count(DISTINCT payload) FROM skiplock.tasks") == KEYS


def test_a_duplicate_returns_the_holder_says_so_and_a_finished_task_no_longer_blocks(db_url, db, store):
    first = skiplock.enqueue(db_url, "t.noop", {"a": 1}, unique=Unique())
    again = skiplock.enqueue(db_url, "t.noop", {"a": 2}, unique=Unique())
    assert (first.created, again.created, again) == (True, False, first)
    assert skiplock.enqueue(db_url, "t.noop", {}, queue="other", unique=Unique()).created  # by queue
    assert skiplock.enqueue(db_url, "t.other", {}, unique=Unique()).created  # by kind
    assert skiplock.enqueue(db_url, "t.noop", {"a": 1}).created  # a plain task is not unique
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() WHERE id = %s", (first,))
    # completed is not among the default states: the key is free again
    assert skiplock.enqueue(db_url, "t.noop", {"a": 3}, unique=Unique()).created


def test_the_states_a_task_blocks_in(db_url, db):
    blocking = Unique(states=("waiting", "queued", "running", "cancelling", "completed"))
    first = skiplock.enqueue(db_url, "t.noop", {}, unique=blocking)
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() WHERE id = %s", (first,))
    assert skiplock.enqueue(db_url, "t.noop", {}, unique=blocking) == first  # completed blocks now
    db.execute("UPDATE skiplock.tasks SET state = 'failed' WHERE id = %s", (first,))
    assert skiplock.enqueue(db_url, "t.noop", {}, unique=blocking).created  # failed does not
    with pytest.raises(InvalidInput, match="must include waiting, queued, running, cancelling"):
        Unique(states=("queued", "running"))
    with pytest.raises(InvalidInput, match="'done' is not a task state"):
        Unique(states=("waiting", "queued", "running", "cancelling", "done"))


def test_a_period_is_a_fixed_window_of_the_database_clock(db_url, db):
    hourly = Unique(by_payload=True, period=3600)
    first = skiplock.enqueue(db_url, "t.noop", {"r": 1}, unique=hourly)
    key, until, window = db.execute(
        "SELECT unique_key, unique_until, floor(extract(epoch FROM now()) / 3600)::bigint FROM skiplock.tasks "
        "WHERE id = %s", (first,)).fetchone()
    assert key.endswith(f"/{window}") and until.timestamp() == (window + 1) * 3600
    assert skiplock.enqueue(db_url, "t.noop", {"r": 1}, unique=hourly) == first
    assert skiplock.enqueue(db_url, "t.noop", {"r": 2}, unique=hourly).created  # another payload
    assert skiplock.enqueue(db_url, "t.noop", {"r": 1}, unique=Unique(by_payload=True, period=60)).created
    # the holder's window moved back an hour: the same enqueue now falls in the next window
    db.execute("UPDATE skiplock.tasks SET unique_key = split_part(unique_key, '/', 1) || '/' || %s "
               "WHERE id = %s", (window - 1, first))
    assert skiplock.enqueue(db_url, "t.noop", {"r": 1}, unique=hourly).created


def test_retention_keeps_a_blocking_task_until_its_window_ends(db_url, db, store):
    done_blocks = Unique(period=3600, states=("waiting", "queued", "running", "cancelling", "completed"))
    held = skiplock.enqueue(db_url, "t.noop", {}, unique=done_blocks)
    free = skiplock.enqueue(db_url, "t.other", {}, unique=Unique(period=3600))  # completed does not block
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() - interval '1 hour'")
    assert store.tasks.task_delete_finished("completed", 60, limit=100) == 1
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE id = %s", (held,)) == 1
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE id = %s", (free,)) == 0
    assert skiplock.enqueue(db_url, "t.noop", {}, unique=done_blocks) == held  # still blocks
    db.execute("UPDATE skiplock.tasks SET unique_until = now() - interval '1 second' WHERE id = %s", (held,))
    assert store.tasks.task_delete_finished("completed", 60, limit=100) == 1  # its window ended


def test_a_failed_task_is_not_resumed_while_another_holds_its_key(db_url, db, store):
    old = skiplock.enqueue(db_url, "t.noop", {}, unique=Unique())
    db.execute("UPDATE skiplock.tasks SET state = 'failed', finished_at = now() WHERE id = %s", (old,))
    holder = skiplock.enqueue(db_url, "t.noop", {}, unique=Unique())
    assert holder.created
    with pytest.raises(TaskNotResumable, match="another task holds its unique key"):
        resume_task(store, old, actor="test")
    # a bulk retry leaves it alone, and retries the others
    other = skiplock.enqueue(db_url, "t.other", {})
    db.execute("UPDATE skiplock.tasks SET state = 'failed', finished_at = now() WHERE id = %s", (other,))
    assert bulk(store, "retry", TaskFilter(state="failed"), actor="test", limit=10) == 1
    assert count(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'failed'") == 1
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now() WHERE id = %s", (holder,))
    assert resume_task(store, old, actor="test") == "queued"


def test_the_api_answers_200_with_the_holder_and_counts_it(api, db):
    body = {"kind": "t.noop", "payload": {"k": 1}, "unique": {"payload_keys": ["k"], "period": 600}}
    first = api.post("/v1/tasks", role="submitter", json=body)
    again = api.post("/v1/tasks", role="submitter", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.get_json()["id"] == again.get_json()["id"]
    batch = api.post("/v1/tasks:batch", role="submitter", json={"tasks": [body, {**body, "payload": {"k": 2}}]})
    assert batch.status_code == 201
    assert [t["created"] for t in batch.get_json()["tasks"]] == [False, True]
    bad = api.post("/v1/tasks", role="submitter", json={**body, "unique": {"states": ["queued"]}})
    assert bad.status_code == 400 and "must include waiting" in bad.get_json()["error"]["message"]
    both = api.post("/v1/tasks", role="submitter", json={**body, "unique": {"by_payload": True,
                                                                            "payload_keys": ["k"]}})
    assert both.status_code == 400 and "not both" in both.get_json()["error"]["message"]
    metrics = api.get("/metrics", role="reader")
    if metrics.status_code == 200:  # /metrics may be served on the metrics port only
        assert "skiplock_enqueue_duplicates_total" in metrics.get_data(as_text=True)


def test_bad_options_are_one_line_errors():
    with pytest.raises(InvalidInput, match="must be a skiplock.Unique"):
        skiplock.enqueue("postgresql://nowhere", "t.noop", {}, unique={"period": 1})
    with pytest.raises(InvalidInput, match="unique period 0"):
        Unique(period=0)
    with pytest.raises(InvalidInput, match="by_payload"):
        Unique(by_payload="k")
    with pytest.raises(InvalidInput, match="does not combine with depends_on"):
        skiplock.enqueue("postgresql://nowhere", "t.noop", {}, unique=Unique(),
                         depends_on=["01a23f04-3b03-77f1-835a-25c6ba136d55"])


class _Recording(psycopg.Cursor):
    seen: list = []

    def execute(self, query, params=None, **kwargs):
        _Recording.seen.append(query)
        return super().execute(query, params, **kwargs)


def test_a_plain_enqueue_runs_the_statements_it_ran_before_the_options(db_url):
    from skiplock.engine import queries

    sql = queries.load("skiplock")
    with psycopg.connect(db_url, autocommit=True, cursor_factory=_Recording) as conn:
        skiplock.enqueue(conn, "t.noop", {})  # the schema check, once per connection
        _Recording.seen.clear()
        skiplock.enqueue(conn, "t.noop", {"a": 1}, idempotency_key="k")
        skiplock.enqueue_many(conn, "t.noop", [{"n": n} for n in range(10)])
        assert _Recording.seen == [sql["task_insert_one"], sql["task_insert"]]
        _Recording.seen.clear()
        skiplock.enqueue(conn, "t.noop", {}, unique=Unique())
        assert _Recording.seen == ["BEGIN", sql["task_insert_unique"], "COMMIT"]

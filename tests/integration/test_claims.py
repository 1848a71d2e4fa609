"""The claim: one statement, SKIP LOCKED, never more rows than asked, each task once per lease."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg

import skiplock
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store
from skiplock.engine.store.tasks import settle_params
from tests.support.plans import explain_prepared


def test_sixteen_threads_claim_twenty_thousand_tasks_each_exactly_once(db_url, db):
    ids = skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(20_000)])
    assert len(set(ids)) == 20_000
    store = Store.pooled(db_url, min_size=16, max_size=16).open(wait=True)
    claimed: list = []
    oversized: list[int] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        limit = 7 + n  # different batch sizes per thread
        while True:
            batch = store.tasks.task_claim(["default"], limit, f"claimer-{n}", 300)
            if len(batch) > limit:
                oversized.append(len(batch))
            if not batch:
                return
            with lock:
                claimed.extend(t.id for t in batch)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    store.close()

    counts = Counter(claimed)
    assert oversized == []
    assert len(claimed) == 20_000
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'running'").fetchone()[0] == 20_000
    # every claim took its own lease token
    tokens = db.execute("SELECT count(DISTINCT lease_token) FROM skiplock.tasks").fetchone()[0]
    assert tokens == 20_000


def test_claim_order_is_priority_then_run_after(store, db_url):
    low = skiplock.enqueue(db_url, "t.noop", {}, priority=0)
    high = skiplock.enqueue(db_url, "t.noop", {}, priority=5)
    later = skiplock.enqueue(db_url, "t.noop", {}, priority=0, delay=3600)
    claimed = store.tasks.task_claim(["default"], 10, "w", 30)
    assert [t.id for t in claimed] == [high, low]
    assert later not in [t.id for t in claimed]


def test_claim_only_from_own_queues_and_skips_paused(store, db_url):
    a = skiplock.enqueue(db_url, "t.noop", {}, queue="a")
    b = skiplock.enqueue(db_url, "t.noop", {}, queue="b")
    b_other_kind = skiplock.enqueue(db_url, "t.record", {}, queue="b")
    store.tasks.pause_set("queue", "a")
    store.tasks.pause_set("kind", "t.noop")
    assert [t.id for t in store.tasks.task_claim(["a", "b"], 10, "w", 30)] == [b_other_kind]
    store.tasks.pause_clear("kind", "t.noop")
    assert [t.id for t in store.tasks.task_claim(["a", "b"], 10, "w", 30)] == [b]
    store.tasks.pause_clear("queue", "a")
    assert [t.id for t in store.tasks.task_claim(["a", "b"], 10, "w", 30)] == [a]


def test_claim_lanes_leave_out_a_queue_whose_lanes_other_claims_hold(store, db_url, db):
    """SKIPLOCK_CLAIM_LANES: a claim holds a lane of each queue it claims from until it commits;
    with every lane of a queue held, another claim leaves that queue out and says so (crowded),
    takes from the others, and never waits. A paused queue takes no lane."""
    a = skiplock.enqueue_many(db_url, "t.noop", [{}] * 4, queue="a")
    b = skiplock.enqueue_many(db_url, "t.noop", [{}] * 4, queue="b")
    params = dict(queues=["a"], limit=1, owner="holder", lease_seconds=30, kind_max_attempts=None, park_limit=0,
                  lanes=2)
    # two claims of queue a in flight, on two connections: both of its lanes held to their commits
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        for conn in (first, second):
            conn.execute(store.db.sql["task_claim"], params)
        held = store.tasks.task_claim(["a", "b"], 10, "w", 30, lanes=2)
        assert (sorted(t.id for t in held), held.crowded) == (sorted(b), 1)
        assert store.tasks.task_claim(["a"], 10, "w", 30, lanes=3).crowded == 0  # a third lane is free
        assert store.tasks.task_claim(["a"], 10, "w", 30).crowded == 0  # 0: no bound
        store.tasks.pause_set("queue", "a")
        assert store.tasks.task_claim(["a"], 10, "w", 30, lanes=2).crowded == 0  # paused, not crowded
        store.tasks.pause_clear("queue", "a")
    claimed = store.tasks.task_claim(["a"], 10, "w", 30, lanes=2)  # the holders committed: lanes free
    assert claimed.crowded == 0
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'running' AND queue = 'a'"
                      ).fetchone()[0] == len(a)


def test_lease_tokens_strictly_increase_across_claims(store, db_url):
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 5)
    first = store.tasks.task_claim(["default"], 2, "w", 30)
    second = store.tasks.task_claim(["default"], 3, "w", 30)
    tokens = [t.lease_token for t in first + second]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_claim_reports_wait_and_attempt(store, db_url):
    skiplock.enqueue(db_url, "t.noop", {"x": 1})
    (task,) = store.tasks.task_claim(["default"], 1, "w", 30)
    assert task.attempt == 1
    assert task.payload == {"x": 1}
    assert 0 <= task.waited_seconds < 60


def test_the_worker_connections_keep_their_index_plans_when_the_table_grows(db_url, db):
    """The worker's claims and outcomes connections plan their statements once (generic plans):
    a plan made while the table held ten rows must still be the index plan at 5,000 rows."""
    skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(10)])
    store = Store.pooled(db_url, worker_connections=True).open(wait=True)
    try:
        for _ in range(8):  # psycopg prepares a statement on its sixth use
            claimed = store.tasks.task_claim(["default"], 5, "w", 30)
            assert len(claimed) == 5
            released = [Settlement(task_id=t.id, lease_token=t.lease_token, outcome="released") for t in claimed]
            assert set(store.tasks.task_settle(released).values()) == {"queued"}
        skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(5_000)])
        db.execute("ANALYZE skiplock.tasks")
        claimed = store.tasks.task_claim(["default"], 100, "w", 30)
        assert len(claimed) == 100
        settlements = [Settlement(task_id=t.id, lease_token=t.lease_token, outcome="completed") for t in claimed]
        params = settle_params(settlements)
        params.update(queues=["default"], limit=100, owner="w", lease_seconds=30, kind_max_attempts=None,
                      park_limit=0, lanes=0)

        for name, pool in (("task_claim", store.db.claim_pool), ("task_settle", store.db.outcome_pool)):
            with store.db.connection(pool=pool) as conn:
                plan, generic, custom = explain_prepared(conn, params, store.db.sql[name])
                assert (generic >= 1, custom) == (True, 0), name
                # the triggers' unavoidable sequential scans cost 10^10 here: JIT would compile them
                assert conn.execute("SELECT current_setting('jit')").fetchone()[0] == "off"
                assert "Seq Scan" not in plan and "Hash" not in plan and "Merge" not in plan, (name, plan)
                if name == "task_claim":
                    assert "Index Scan using tasks_claimable" in plan, plan
                    assert "Tid Scan" in plan, plan
                else:
                    # the probe, the update, and the busy check of a claim the probe skipped: each
                    # by primary key, none a read of every leased task
                    assert plan.count("Index Scan using tasks_pkey") == 3, plan
                    assert "tasks_leased" not in plan, plan
        # every other connection keeps Postgres's own choice (handlers' ctx.transaction() among them)
        with store.connection() as conn:
            assert conn.execute("SELECT current_setting('plan_cache_mode')").fetchone()[0] == "auto"
            assert conn.execute("SELECT current_setting('enable_seqscan')").fetchone()[0] == "on"
    finally:
        store.close()


def test_new_worker_connections_run_their_statement_once_and_change_nothing(db_url, db):
    """The claims and outcomes connections read their catalogs and plan their statement as they
    open (a claim of 0 tasks; the outcome of a task that does not exist), not on the first claim."""
    ids = skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(3)])
    before = db.execute("SELECT last_value, is_called FROM skiplock.lease_tokens").fetchone()
    store = Store.pooled(db_url, name="warm", worker_connections=True).open(wait=True)
    try:
        last = dict(db.execute("SELECT application_name, query FROM pg_stat_activity "
                               "WHERE datname = current_database() AND application_name LIKE 'skiplock-warm-%'")
                    .fetchall())
        assert "FOR UPDATE SKIP LOCKED" in last["skiplock-warm-claims"]
        assert "jsonb_to_recordset" in last["skiplock-warm-outcomes"]
        assert db.execute("SELECT last_value, is_called FROM skiplock.lease_tokens").fetchone() == before
        assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE state = 'queued' AND id = ANY(%s)",
                          (ids,)).fetchone()[0] == 3
        assert db.execute("SELECT count(*) FROM skiplock.task_events").fetchone()[0] == 3
        assert len(store.tasks.task_claim(["default"], 10, "w", 30)) == 3
    finally:
        store.close()


def test_claimed_payloads_come_back_as_they_were_enqueued(db_url, db):
    """The claims connection loads payloads with a loader of its own (json's C scanner)."""
    payloads = [{"text": "tab\there", "nl": "line\nbreak", "bs": "C:\\path\\n", "q": "it's \"quoted\"",
                 "uni": "żółć 漢字 🚀", "n": 10**20, "f": -1.5e-300, "nested": [None, True, {"\\N": []}]},
                [], {}, "a string", 0, 2.5, True, None, [1, [2, [3, {"k": "v"}]]], "ünïcödé"]
    ids = [skiplock.enqueue(db_url, "t.noop", p) for p in payloads]
    store = Store.pooled(db_url, worker_connections=True).open(wait=True)
    try:
        claimed = {t.id: t.payload for t in store.tasks.task_claim(["default"], 100, "w", 30)}
    finally:
        store.close()
    expected = [{} if p is None else p for p in payloads]  # no payload is stored as {}
    assert [claimed[i] for i in ids] == expected

"""The claim: one statement, SKIP LOCKED, never more rows than asked, each task once per lease."""

from __future__ import annotations

import threading
from collections import Counter

import skiplock
from skiplock.engine.store import Store


def test_sixteen_threads_claim_twenty_thousand_tasks_each_exactly_once(db_url, db):
    ids = skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(20_000)])
    assert len(set(ids)) == 20_000
    store = Store(db_url, min_size=16, max_size=16).open(wait=True)
    claimed: list = []
    oversized: list[int] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        limit = 7 + n  # different batch sizes per thread
        while True:
            batch = store.claim(["default"], limit, f"claimer-{n}", 300)
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
    claimed = store.claim(["default"], 10, "w", 30)
    assert [t.id for t in claimed] == [high, low]
    assert later not in [t.id for t in claimed]


def test_claim_only_from_own_queues_and_skips_paused(store, db_url):
    a = skiplock.enqueue(db_url, "t.noop", {}, queue="a")
    b = skiplock.enqueue(db_url, "t.noop", {}, queue="b")
    b_other_kind = skiplock.enqueue(db_url, "t.record", {}, queue="b")
    store.pause("queue", "a")
    store.pause("kind", "t.noop")
    assert [t.id for t in store.claim(["a", "b"], 10, "w", 30)] == [b_other_kind]
    store.unpause("kind", "t.noop")
    assert [t.id for t in store.claim(["a", "b"], 10, "w", 30)] == [b]
    store.unpause("queue", "a")
    assert [t.id for t in store.claim(["a", "b"], 10, "w", 30)] == [a]


def test_lease_tokens_strictly_increase_across_claims(store, db_url):
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 5)
    first = store.claim(["default"], 2, "w", 30)
    second = store.claim(["default"], 3, "w", 30)
    tokens = [t.lease_token for t in first + second]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_claim_reports_wait_and_attempt(store, db_url):
    skiplock.enqueue(db_url, "t.noop", {"x": 1})
    (task,) = store.claim(["default"], 1, "w", 30)
    assert task.attempt == 1
    assert task.payload == {"x": 1}
    assert 0 <= task.waited_seconds < 60

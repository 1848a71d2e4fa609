"""Flow control with real worker processes (issue 20): a concurrency limit per key holds across
workers, a rate limit holds to its bucket, and the claim shares slots fairly between keys. Each
handler records its start and end (t.span, public.executions); starts are also read from the
claims' own events, on the database's clock that the buckets use."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import skiplock
from skiplock.engine.limits import Limit, apply_limits
from tests.support.harness import scalar, wait_for

ENV = {"SKIPLOCK_LEASE_SECONDS": 5, "SKIPLOCK_HEARTBEAT_SECONDS": 1}


def spans(db, kind: str) -> dict[str, list[tuple[float, float]]]:
    """{concurrency key: [(start, end)]} of the runs that ended, in seconds of the database clock."""
    rows = db.execute("""
        SELECT t.concurrency_key, extract(epoch FROM s.at)::float8, extract(epoch FROM e.at)::float8
        FROM skiplock.tasks AS t
        JOIN public.executions AS s ON s.task_id = t.id AND s.note = 'start'
        JOIN public.executions AS e ON e.task_id = t.id AND e.note = 'end' AND e.pid = s.pid
                                   AND e.attempt = s.attempt
        WHERE t.kind = %s""", (kind,)).fetchall()
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, start, end in rows:
        by_key[key].append((start, end))
    return by_key


def most_at_once(intervals) -> int:
    """The most intervals open at one instant (an end at the instant of a start closes first)."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    most = now = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def test_a_concurrency_limit_per_key_holds_across_three_workers(db_url, db, processes, store):
    rng = random.Random(20)
    keys = [f"customer:{i}" for i in range(5)]
    apply_limits(store, [Limit.build("t.span", concurrency=2)])
    durations = [rng.uniform(0.05, 0.2) for _ in range(200)]
    workers = [processes.spawn(db_url, "--concurrency", "8", env=ENV) for _ in range(3)]
    for w in workers:
        processes.wait_ready(w)
    skiplock.enqueue_many(db_url, "t.span", [{"sleep": d} for d in durations],
                          concurrency_keys=[keys[i % 5] for i in range(200)])
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == 200,
             90, interval=0.2, message="200 tasks completed")

    by_key = spans(db, "t.span")
    assert sorted(by_key) == keys
    assert sum(len(v) for v in by_key.values()) == 200  # each ran once
    overlaps = {key: most_at_once(v) for key, v in by_key.items()}
    print(f"most runs at once per key: {overlaps}")
    assert overlaps == dict.fromkeys(keys, 2)
    # more than one worker took part (the ten slots the limits allow need not reach all three)
    assert scalar(db, "SELECT count(DISTINCT pid) FROM public.executions") >= 2
    starts = [s for v in by_key.values() for s, _ in v]
    ends = [e for v in by_key.values() for _, e in v]
    makespan = max(ends) - min(starts)
    ideal = sum(durations) / 10  # 5 keys x 2 runs at once
    print(f"makespan {makespan:.2f} s, ideal {ideal:.2f} s, ratio {makespan / ideal:.2f}")
    # the 1.5x is measured on a quiet machine (the closing note's figure: 1.22); on a shared
    # CI machine a stall of a few seconds can stretch it, so the check here is the mechanism: the
    # ten slots stay busy, with no wait for the 1-s poll per task (serialized, it would be > 5x)
    assert makespan <= 2.5 * ideal


def test_a_rate_limit_holds_to_its_bucket(db_url, db, processes, store):
    apply_limits(store, [Limit.build("t.noop", rate="20/s", burst=5)])
    workers = [processes.spawn(db_url, "--concurrency", "8", env=ENV) for _ in range(2)]
    for w in workers:
        processes.wait_ready(w)
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 300)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == 300,
             60, interval=0.2, message="300 tasks completed")
    # the claims' times, on the database clock the bucket runs on
    starts = [r[0] for r in db.execute(
        "SELECT extract(epoch FROM at)::float8 FROM skiplock.task_events WHERE type = 'running' ORDER BY at")]
    assert len(starts) == 300
    j = 0
    most_in_a_second = 0
    for i, start in enumerate(starts):  # every window of one second that opens at a start
        while j < len(starts) and starts[j] < start + 1.0:
            j += 1
        most_in_a_second = max(most_in_a_second, j - i)
    # after the burst of 5, one start per token: 20 a second
    rate = (len(starts) - 5) / (starts[-1] - starts[0])
    print(f"most starts in one second {most_in_a_second}, rate {rate:.2f}/s")
    assert most_in_a_second <= 25
    assert 18 <= rate <= 22
    assert Counter(r[0] for r in db.execute("SELECT attempts FROM skiplock.tasks")) == {1: 300}


def test_fair_share_lets_small_keys_finish_before_a_big_one_runs_200(db_url, db, processes, store):
    apply_limits(store, [Limit.build("t.span", concurrency=1)])
    skiplock.enqueue_many(db_url, "t.span", [{"sleep": 0.01}] * 2000, concurrency_key="A")
    for key in "BCDE":
        skiplock.enqueue_many(db_url, "t.span", [{"sleep": 0.01}] * 20, concurrency_key=key)
    workers = [processes.spawn(db_url, "--concurrency", "8", env=ENV) for _ in range(2)]
    for w in workers:
        processes.wait_ready(w)

    def small_keys_done():
        return scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE concurrency_key <> 'A' "
                          "AND state = 'completed'") == 80

    wait_for(small_keys_done, 60, interval=0.05, message="the 80 tasks of keys B-E completed")
    # the runs of A that had started by the time the last of B-E ended
    last_small_end = scalar(db, "SELECT max(e.at) FROM public.executions AS e JOIN skiplock.tasks AS t "
                                "ON t.id = e.task_id WHERE e.note = 'end' AND t.concurrency_key <> 'A'")
    big_started = scalar(db, "SELECT count(*) FROM public.executions AS e JOIN skiplock.tasks AS t "
                             "ON t.id = e.task_id WHERE e.note = 'start' AND t.concurrency_key = 'A' "
                             "AND e.at <= %s", (last_small_end,))
    print(f"runs of A when B-E were done: {big_started}")
    assert 0 < big_started < 200

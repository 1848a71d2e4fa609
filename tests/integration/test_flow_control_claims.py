"""Flow control at the claim (migration 0016): what task_claim parks, what task_claim_limited takes
under concurrency and rate limits, and the rules around them (no head-of-line blocking, no attempt
spent while throttled, an expired lease frees its group's slot, a limit's deletion lets its tasks
go). Real Postgres, the store's own statements; the worker processes are tests/acceptance's."""

from __future__ import annotations

import time

import pytest

import skiplock
from skiplock.engine.errors import InvalidInput
from skiplock.engine.limits import Limit, apply_limits, parse_rate
from skiplock.engine.model import Settlement
from skiplock.engine.store import Store
from tests.support.harness import scalar
from tests.support.plans import explain_prepared


def claim_all(store: Store, limit: int = 100, owner: str = "w", lease: float = 30):
    """One claimer's round as the worker makes it: limited first, then the rest; parking rounds
    repeat until nothing more is parked."""
    tasks = []
    while True:
        tasks += store.tasks.task_claim_limited(["default"], limit, owner, lease)
        claim = store.tasks.task_claim(["default"], limit, owner, lease)
        tasks += claim
        if not claim.parked:
            break
    tasks += store.tasks.task_claim_limited(["default"], limit, owner, lease)
    return tasks


def complete(store: Store, tasks) -> None:
    store.tasks.task_settle([Settlement(t.id, t.lease_token, "completed") for t in tasks])


def test_concurrency_limit_per_key_holds_across_claims(store, db_url, db):
    apply_limits(store, [Limit.build("fc.k", concurrency=2)])
    for key in ("a", "b", "c"):
        skiplock.enqueue_many(db_url, "fc.k", [{}] * 5, concurrency_key=key)
    skiplock.enqueue_many(db_url, "fc.k", [{}] * 5)  # no key: one group of its own

    first = claim_all(store)
    assert sorted(t.kind for t in first) == ["fc.k"] * 8  # 2 per group, 4 groups
    assert all(t.limited for t in first)
    by_key = db.execute("SELECT concurrency_key, count(*) FROM skiplock.tasks WHERE state = 'running' "
                        "GROUP BY 1 ORDER BY 1").fetchall()
    assert by_key == [("", 2), ("a", 2), ("b", 2), ("c", 2)]
    # a second claimer finds no room, however many times it asks
    for _ in range(3):
        assert claim_all(store, owner="other") == []
    # the throttled tasks spent no attempt and stay queued, parked
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'queued' AND limited AND attempts = 0") == 12

    complete(store, first[:1])
    again = claim_all(store, owner="other")
    assert len(again) == 1


def test_a_throttled_head_of_queue_does_not_block_other_kinds(store, db_url):
    apply_limits(store, [Limit.build("fc.slow", concurrency=1)])
    skiplock.enqueue_many(db_url, "fc.slow", [{}] * 300, priority=5)
    free = skiplock.enqueue_many(db_url, "fc.free", [{}] * 20)

    tasks = claim_all(store, limit=50)
    kinds = [t.kind for t in tasks]
    assert kinds.count("fc.slow") == 1
    assert sorted(t.id for t in tasks if t.kind == "fc.free") == sorted(free)
    # once parked, the throttled tasks are out of the plain claim's index: it steps over none
    assert store.tasks.task_claim(["default"], 50, "w", 30).parked == 0


def test_rate_limit_is_a_token_bucket_on_the_database_clock(store, db_url, db):
    apply_limits(store, [Limit.build("fc.r", rate="20/s", burst=5)])
    skiplock.enqueue_many(db_url, "fc.r", [{}] * 100)
    assert store.tasks.task_claim(["default"], 100, "w", 30).parked == 100
    first = store.tasks.task_claim_limited(["default"], 100, "w", 30)
    assert len(first) == 5  # the burst
    claim = store.tasks.task_claim_limited(["default"], 100, "w", 30)
    # a token comes every 1/20 s: none yet, or one if the machine was slow between the two claims
    assert len(claim) <= 1
    if not claim:
        assert claim.wake_in is not None and 0 < claim.wake_in <= 0.05 + 1e-9
    time.sleep(0.5)
    later = store.tasks.task_claim_limited(["default"], 100, "w", 30)
    assert len(later) == 5  # ten tokens' time, but the bucket holds five


def test_fair_share_rotates_between_groups(store, db_url):
    apply_limits(store, [Limit.build("fc.f", concurrency=1)])
    skiplock.enqueue_many(db_url, "fc.f", [{}] * 200, concurrency_key="A")
    for key in "BCDE":
        skiplock.enqueue_many(db_url, "fc.f", [{}] * 3, concurrency_key=key)
    ran: list[str] = []
    while True:
        tasks = claim_all(store, limit=2)  # fewer slots than groups: the rotation decides
        if not tasks:
            break
        ran += [t.id for t in tasks]
        complete(store, tasks)
        if len(ran) >= 40:
            break
    with store.connection() as conn:
        keys = dict(conn.execute("SELECT id, concurrency_key FROM skiplock.tasks").fetchall())
    order = [keys[i] for i in ran]
    small_done = max(i for i, k in enumerate(order) if k != "A")
    assert sum(1 for k in order if k != "A") == 12
    # B-E's 12 tasks all ran while A ran at most its share: about one in five starts
    assert order[:small_done + 1].count("A") <= 5


def test_an_expired_lease_frees_its_slot_and_its_heartbeat_is_refused(store, db_url, db):
    apply_limits(store, [Limit.build("fc.e", concurrency=1)])
    skiplock.enqueue_many(db_url, "fc.e", [{}] * 2)
    (held,) = claim_all(store, lease=0.3)
    assert claim_all(store) == []
    time.sleep(0.4)
    # the lease ran out (no reclaim yet): the slot is free, and the zombie cannot renew its way back
    (second,) = claim_all(store)
    assert store.tasks.task_heartbeat([(held.id, held.lease_token)], 30) == {}
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'running'") == 2
    assert store.tasks.task_heartbeat([(second.id, second.lease_token)], 30) == {second.id: "running"}


def test_a_retried_task_is_parked_again_under_the_limit_then(store, db_url, db):
    apply_limits(store, [Limit.build("fc.t", concurrency=1)])
    (task_id,) = skiplock.enqueue_many(db_url, "fc.t", [{}])
    (task,) = claim_all(store)
    store.tasks.task_settle([Settlement(task.id, task.lease_token, "retry", delay=0)])
    assert scalar(db, "SELECT limited FROM skiplock.tasks WHERE id = %s", (task_id,)) is False
    (again,) = claim_all(store)
    assert again.id == task_id and again.limited and again.attempt == 2


def test_deleting_a_limit_lets_its_parked_tasks_go(store, db_url, db):
    apply_limits(store, [Limit.build("fc.d", concurrency=1)])
    skiplock.enqueue_many(db_url, "fc.d", [{}] * 10)
    assert len(claim_all(store)) == 1
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE limited AND state = 'queued'") == 9
    assert store.limits.limit_delete(["fc.d"]) == ["fc.d"]
    assert scalar(db, "SELECT count(*) FROM skiplock.limit_groups") == 0
    assert len(claim_all(store)) == 9


def test_a_parked_group_left_out_of_the_rotation_is_put_back(store, db_url, db):
    apply_limits(store, [Limit.build("fc.w", concurrency=3)])
    skiplock.enqueue_many(db_url, "fc.w", [{}] * 4, concurrency_key="x")
    running = claim_all(store)
    assert len(running) == 3
    # what a park committed between another claim's snapshot and its lock leaves behind
    db.execute("UPDATE skiplock.limit_groups SET drained = true")
    assert store.tasks.task_claim_limited(["default"], 10, "w", 30) == []
    assert store.limits.limit_group_wake() == 1
    assert store.limits.limit_group_wake() == 0
    db.execute("DELETE FROM skiplock.limit_groups")
    assert store.limits.limit_group_wake() == 1
    complete(store, running[:1])
    assert len(claim_all(store)) == 1  # back in the rotation: the fourth task takes the freed room


def test_limit_stats_count_what_the_claim_sees(store, db_url):
    apply_limits(store, [Limit.build("fc.s", concurrency=2), Limit.build("fc.q", rate="10/m")])
    skiplock.enqueue_many(db_url, "fc.s", [{}] * 6, concurrency_key="one")
    skiplock.enqueue_many(db_url, "fc.s", [{}] * 1, concurrency_key="two")
    skiplock.enqueue_many(db_url, "fc.q", [{}] * 3)
    claim_all(store)
    stats = {s.kind: s for s in store.limits.limit_stats()}
    assert (stats["fc.s"].throttled, stats["fc.s"].running, stats["fc.s"].busy_groups) == (4, 3, 2)
    assert stats["fc.s"].saturation == pytest.approx(3 / 4)
    assert stats["fc.q"].running == 1 and stats["fc.q"].throttled == 2  # burst 1 for 10/m
    assert stats["fc.q"].tokens is not None and stats["fc.q"].tokens < 1
    queues = {q: (claimable, throttled) for q, claimable, _age, _paused, throttled in store.tasks.queue_claimable()}
    assert queues["default"] == (0, 6)


@pytest.mark.parametrize("fields, message", [
    (dict(concurrency=0), "concurrency 0: must be a positive integer"),
    (dict(concurrency=-3), "concurrency -3: must be a positive integer"),
    (dict(rate="0/s"), "rate '0/s': the count must be a positive integer"),
    (dict(rate="fast"), "rate 'fast': expected N/s, N/m, N/h or N/d (e.g. 100/s)"),
    (dict(rate="10/s", burst=0), "burst 0: must be a positive integer"),
    (dict(burst=3, concurrency=1), "burst: only with a rate (--rate)"),
    (dict(), "limit of 'fc.bad': give a concurrency, a rate, or both"),
])
def test_bad_limits_are_refused_naming_the_field(fields, message):
    with pytest.raises(InvalidInput) as caught:
        Limit.build("fc.bad", **fields)
    assert str(caught.value) == message


def test_rates_parse_per_unit():
    assert parse_rate("100/s") == (100, 1.0)
    assert parse_rate("30/m") == (30, 60.0)
    assert parse_rate("5/10s") == (5, 10.0)
    assert parse_rate("2/h") == (2, 3600.0)
    assert Limit.build("k", rate="100/s").burst == 100
    assert Limit.build("k", rate="10/m").burst == 1


def test_a_concurrency_key_over_256_bytes_is_refused_and_nothing_written(db_url, db):
    with pytest.raises(InvalidInput, match=r"^concurrency_key: must be at most 256 bytes \(got 257\)$"):
        skiplock.enqueue(db_url, "fc.k", {}, concurrency_key="x" * 257)
    with pytest.raises(InvalidInput, match="concurrency_key"):
        skiplock.enqueue_many(db_url, "fc.k", [{}, {}], concurrency_keys=["ok", "é" * 129])
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks") == 0
    skiplock.enqueue(db_url, "fc.k", {}, concurrency_key="é" * 128)  # 256 bytes: the most
    keys = skiplock.enqueue_many(db_url, "fc.k", [{}] * 70, concurrency_key="tab\there\\n")  # the COPY path
    assert scalar(db, "SELECT count(DISTINCT concurrency_key) FROM skiplock.tasks WHERE id = ANY(%s)",
                  (keys,)) == 1
    assert scalar(db, "SELECT concurrency_key FROM skiplock.tasks WHERE id = %s", (keys[0],)) == "tab\there\\n"


def test_the_worker_s_generic_plans_of_the_limited_claim_read_only_indexes(db_url, db):
    """On the worker's claims connection (generic plans, no sequential scans): the group lock reads
    limit_groups_rotation, the claim reads tasks_parked for tasks and tasks_limited_running for
    live runs, by index alone."""
    store = Store.pooled(db_url, worker_connections=True).open(wait=True)
    try:
        apply_limits(store, [Limit.build("fc.p", concurrency=2, rate="1000/s")])
        skiplock.enqueue_many(db_url, "fc.p", [{}] * 400, concurrency_keys=[f"k{i % 40}" for i in range(400)])
        db.execute("ANALYZE skiplock.tasks")
        for _ in range(8):
            store.tasks.task_claim(["default"], 100, "w", 30, park_limit=1000)
            store.tasks.task_claim_limited(["default"], 10, "w", 30)
        with store.db.connection(pool=store.db.claim_pool) as conn:
            lock_plan, generic, custom = explain_prepared(conn, {"groups": 20}, store.db.sql["limit_group_lock"])
            assert (generic >= 1, custom) == (True, 0)
            params = dict(kinds=["fc.p"] * 3, keys=["k1", "k2", "k3"], queues=["default"], limit=10, owner="w",
                          lease_seconds=30, kind_max_attempts=None)
            with conn.transaction(force_rollback=True):
                claim_plan, generic, custom = explain_prepared(conn, params, store.db.sql["task_claim_limited"])
            assert (generic >= 1, custom) == (True, 0)
    finally:
        store.close()
    for plan in (lock_plan, claim_plan):
        assert "Seq Scan" not in plan and "Hash Join" not in plan, plan
    assert "limit_groups_rotation" in lock_plan, lock_plan
    assert "Index Scan using tasks_parked" in claim_plan, claim_plan
    assert "tasks_limited_running" in claim_plan, claim_plan
    # the statistics predate the parked tasks: the update still fetches the chosen rows by TID,
    # not by a read of all of tasks_parked (an index the planner believes empty)
    claimed = claim_plan[claim_plan.index("CTE claimed"):claim_plan.index("CTE claim_events")]
    assert "Tid Scan on tasks" in claimed and "Index" not in claimed, claimed

"""The claim at a large backlog across 8 queues (issue 19): its plan reads tasks_claimable, one
index-ordered scan per queue, locking as it goes, whether Postgres plans it for the call's values
(a custom plan: a worker behind a transaction pooler, or any connection left to Postgres's
defaults) or once for all values (the generic plan of the worker's claims connection, and the one
Postgres's own plan cache switches to after five executions of a prepared statement).

The backlog is big enough for the index to matter: without it, Postgres reads the table and sorts
what it found, per queue; the test shows that plan refused by the same check, so the check can
fail. 100,000 tasks in `make test`, 1,000,000 under `make reliability`.
"""

from __future__ import annotations

import psycopg
import pytest

from skiplock.engine.store import Store
from tests.support.plans import explain_prepared, plan_nodes
from tests.support.sizes import sized

BACKLOG = sized(100_000, 1_000_000)
QUEUES = [f"q{i}" for i in range(8)]
LIMIT = 100

# One statement, set-based. Most tasks are due now at priority 0, as in a backlog; a few carry a
# higher priority, 1 % are delayed into the future, and run_after spreads over the last hour, so
# the statistics are not of one value. The insert trigger writes their 'queued' events.
SEED = """
INSERT INTO skiplock.tasks (id, kind, queue, priority, payload, run_after)
SELECT skiplock.uuid7(), 't.noop', 'q' || (i %% 8), CASE WHEN i %% 50 = 0 THEN 1 ELSE 0 END,
       jsonb_build_object('i', i),
       CASE WHEN i %% 100 = 1 THEN now() + interval '1 hour'
            ELSE now() - interval '1 hour' + i * (interval '1 hour' / %(n)s) END
FROM generate_series(1, %(n)s) AS i
"""


def assert_claims_by_index(plan) -> None:
    """The claim's plan reads skiplock.tasks only through tasks_claimable (one scan per queue, in
    the index's order, locking each row as it comes: Limit over LockRows over the Index Scan, no
    Sort between) and the UPDATE's TID scan: no sequential scan, no bitmap scan, no other index."""
    on_tasks = [(node, above) for node, above in plan_nodes(plan)
                if node.get("Relation Name") == "tasks" and node["Node Type"] != "ModifyTable"]
    kinds = sorted({(n["Node Type"], n.get("Index Name")) for n, _ in on_tasks})
    assert kinds == [("Index Scan", "tasks_claimable"), ("Tid Scan", None)], kinds
    for node, above in on_tasks:
        if node["Node Type"] == "Index Scan":
            assert node["Scan Direction"] == "Forward", node
            assert "queue = " in node["Index Cond"], node["Index Cond"]
            assert [a["Node Type"] for a in above[-2:]] == ["Limit", "LockRows"], [a["Node Type"] for a in above]
    # the per-queue scan runs inside the loop over the queues (each with its lane taken, or not):
    # one lateral subquery per queue
    loops = [n for n, _ in plan_nodes(plan) if n["Node Type"] == "Nested Loop"]
    assert any(any(c["Node Type"] == "CTE Scan" and c.get("CTE Name") == "claimed_queues"
                   for c in n["Plans"]) for n in loops), plan


def summary(plan) -> str:
    """How the plan reads skiplock.tasks, in one line (what the test prints)."""
    return ", ".join(f"{n['Node Type']}" + (f" using {n['Index Name']}" if n.get("Index Name") else "")
                     for n, _ in plan_nodes(plan) if n.get("Relation Name") == "tasks")


@pytest.fixture
def backlog(db_url, db):
    db.execute(SEED, {"n": BACKLOG})
    db.execute("ANALYZE skiplock.tasks")
    assert db.execute("SELECT count(DISTINCT queue), count(*) FROM skiplock.tasks "
                      "WHERE state = 'queued'").fetchone() == (8, BACKLOG)
    return db_url


def _claim_params(limit: int = LIMIT) -> dict:
    return dict(queues=QUEUES, limit=limit, owner="w", lease_seconds=30, kind_max_attempts=None, park_limit=0, lanes=0)


def test_the_custom_plan_reads_the_partial_index(backlog, db):
    """Planned for the call's values on a connection with Postgres's defaults: what a worker
    behind a transaction pooler runs (nothing prepared, no session settings)."""
    store = Store.pooled(backlog, worker_connections=True, pooler="transaction").open(wait=True)
    try:
        with store.db.connection(pool=store.db.claim_pool) as conn:
            assert conn.execute("SELECT current_setting('plan_cache_mode'), "
                                "current_setting('enable_seqscan')").fetchone() == ("auto", "on")
            (plan,) = conn.execute("EXPLAIN (FORMAT JSON) " + store.db.sql["task_claim"],
                                   _claim_params()).fetchone()
        print(f"{BACKLOG} queued, custom plan: {summary(plan)}")
        assert_claims_by_index(plan)
        claimed = store.tasks.task_claim(QUEUES, LIMIT, "w", 30)
        assert len(claimed) == LIMIT
    finally:
        store.close()

    # the control: without the index, the same backlog has another plan, which the check refuses
    with db.transaction(force_rollback=True):
        db.execute("DROP INDEX skiplock.tasks_claimable")
        (plan,) = db.execute("EXPLAIN (FORMAT JSON) " + store.db.sql["task_claim"], _claim_params()).fetchone()
        print(f"{BACKLOG} queued, no tasks_claimable: {summary(plan)}")
        with pytest.raises(AssertionError):
            assert_claims_by_index(plan)


def test_the_worker_s_generic_plan_reads_the_partial_index(backlog):
    """The worker's claims connection prepares the claim (psycopg, from its sixth use) and plans
    it once, generically (plan_cache_mode = force_generic_plan): the plan that serves every claim."""
    store = Store.pooled(backlog, worker_connections=True).open(wait=True)
    try:
        for limit in (1, 5, 10, 50, 100, 7, 3, 100):
            assert len(store.tasks.task_claim(QUEUES, limit, "w", 30)) == limit
        with store.db.connection(pool=store.db.claim_pool) as conn:
            plan, generic, custom = explain_prepared(conn, _claim_params(), store.db.sql["task_claim"],
                                                     "FORMAT JSON")
        assert (generic >= 3, custom) == (True, 0)
        print(f"{BACKLOG} queued, the worker's generic plan: {summary(plan)}")
        assert_claims_by_index(plan)
    finally:
        store.close()


def test_postgres_s_own_switch_to_a_generic_plan_keeps_the_partial_index(backlog, db):
    """A connection with Postgres's defaults that prepares the claim: after five custom plans the
    plan cache weighs a generic one, and with plan_cache_mode = force_generic_plan it uses one
    from the start; neither leaves the index."""
    sql = Store.pooled(backlog).db.sql["task_claim"]
    with psycopg.connect(backlog, autocommit=True, prepare_threshold=0) as conn:
        for _ in range(6):
            assert len(conn.execute(sql, _claim_params()).fetchall()) == LIMIT + 1  # and the summary row
        plan, generic, custom = explain_prepared(conn, _claim_params(), sql, "FORMAT JSON")
        assert generic + custom == 6
        generic, custom = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements").fetchone()
        assert generic + custom == 7  # the EXPLAIN's own choice counted
        print(f"{BACKLOG} queued, the 7th execution (plan cache: {generic} generic, {custom} custom so far): "
              f"{summary(plan)}")
        assert_claims_by_index(plan)

        conn.execute("SET plan_cache_mode = force_generic_plan")
        plan, _, _ = explain_prepared(conn, _claim_params(), sql, "FORMAT JSON")
        print(f"{BACKLOG} queued, force_generic_plan: {summary(plan)}")
        assert_claims_by_index(plan)
        assert conn.execute("SELECT generic_plans FROM pg_prepared_statements").fetchone()[0] >= 1

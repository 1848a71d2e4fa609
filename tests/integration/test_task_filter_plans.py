"""A task list filtered by a queue or a kind that never had a task reads no task at all (0015):
queue_kinds answers first, and the scan of tasks is never executed. A known value still lists
its tasks, with custom plans and with the generic plan a prepared statement switches to."""

from __future__ import annotations

import json

import pytest

import skiplock
from skiplock.engine import queries

PARAMS = dict.fromkeys(("ids", "queue", "state", "kind", "idempotency_key", "created_after", "created_before",
                        "cursor"))


def _seed(db) -> None:
    db.execute("INSERT INTO skiplock.tasks (id, kind, queue, payload) "
               "SELECT gen_random_uuid(), 'kind.' || (i % 8), 'queue.' || (i % 5), '{}' "
               "FROM generate_series(1, 20000) AS i")
    db.execute("ANALYZE skiplock.tasks")


def _tasks_nodes(plan: dict) -> list[dict]:
    """Every plan node that reads skiplock.tasks."""
    found, stack = [], [plan]
    while stack:
        node = stack.pop()
        if node.get("Relation Name") == "tasks":
            found.append(node)
        stack.extend(node.get("Plans", []))
    return found


def _analyze(db, params: dict) -> dict:
    (plan,) = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries.load("skiplock")["task_list"],
                         params).fetchone()
    return plan[0]["Plan"]


@pytest.mark.parametrize("field", ["queue", "kind"])
def test_a_filter_that_matches_nothing_reads_no_task(db, field):
    _seed(db)
    plan = _analyze(db, {**PARAMS, field: "no-such-value", "limit": 51})
    nodes = _tasks_nodes(plan)
    assert nodes, json.dumps(plan)
    # "never executed": the one-time filter was false, so no row of tasks was read
    assert all(node["Actual Loops"] == 0 for node in nodes), json.dumps(plan)
    assert plan["Actual Rows"] == 0


@pytest.mark.parametrize("field, value, expected", [("queue", "queue.3", 4000), ("kind", "kind.5", 2500)])
def test_a_known_value_lists_its_tasks_with_custom_and_generic_plans(db, field, value, expected):
    _seed(db)
    statement = queries.load("skiplock")["task_list"]
    for plan_cache_mode in ("force_custom_plan", "force_generic_plan"):
        db.execute(f"SET plan_cache_mode = {plan_cache_mode}")
        rows = db.execute(statement, {**PARAMS, field: value, "limit": 100_000}, prepare=True).fetchall()
        assert len(rows) == expected, plan_cache_mode
        assert db.execute(statement, {**PARAMS, field: "no-such-value", "limit": 51}, prepare=True).fetchall() == []


def test_every_enqueue_path_registers_its_queue_and_kind(db, db_url):
    skiplock.enqueue(db_url, "single.kind", {}, queue="q_single")
    skiplock.enqueue_many(db_url, "bulk.kind", [{}] * 3, queue="q_bulk")           # arrays
    skiplock.enqueue_many(db_url, "copy.kind", [{}] * 2_000, queue="q_copy")       # COPY
    skiplock.enqueue_many(db_url, "copy.kind", [{}] * 2_000, queue="q_copy")       # known: no new row
    assert db.execute("SELECT queue, kind FROM skiplock.queue_kinds ORDER BY 1").fetchall() == [
        ("q_bulk", "bulk.kind"), ("q_copy", "copy.kind"), ("q_single", "single.kind")]
    statement = queries.load("skiplock")["task_list"]
    assert len(db.execute(statement, {**PARAMS, "kind": "copy.kind", "limit": 10}).fetchall()) == 10
    assert len(db.execute(statement, {**PARAMS, "queue": "q_single", "limit": 10}).fetchall()) == 1

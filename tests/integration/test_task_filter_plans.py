"""A task list filtered by a queue or a kind that has no task reads an index range, not the
table (0014): the plan of task_list on a table of thousands of rows, after ANALYZE."""

from __future__ import annotations

import json

import pytest

from skiplock.engine import queries


@pytest.mark.parametrize("field, index", [("queue", "tasks_queue_id"), ("kind", "tasks_kind_id")])
def test_a_filter_that_matches_nothing_reads_its_index(db, field, index):
    db.execute("INSERT INTO skiplock.tasks (id, kind, queue, payload) "
               "SELECT gen_random_uuid(), 'kind.' || (i % 8), 'queue.' || (i % 5), '{}' "
               "FROM generate_series(1, 20000) AS i")
    db.execute("ANALYZE skiplock.tasks")
    params = dict.fromkeys(("ids", "queue", "state", "kind", "idempotency_key", "created_after", "created_before",
                            "cursor"))
    params.update({field: "no-such-value", "limit": 51})
    (plan,) = db.execute("EXPLAIN (FORMAT JSON) " + queries.load("skiplock")["task_list"], params).fetchone()
    text = json.dumps(plan)
    assert index in text and "Seq Scan" not in text, text

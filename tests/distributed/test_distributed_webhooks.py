"""Webhooks from the outbox on the distributed placement: a real dispatcher delivers, signed, one
request per event of the endpoint's types for tasks that a real worker runs in queues on both
nodes (the routed statements write the deliveries in the transitions' own transactions, where one
Postgres has a trigger), and a task's events arrive in their order, with its trace context."""

from __future__ import annotations

import pytest

import skiplock
from skiplock.engine.store import Store
from tests.distributed.test_distributed_faults import fresh  # noqa: F401  (the fixture)
from tests.distributed.test_distributed_placement import node_of_queue
from tests.integration.test_trace_context import TRACER, traceparent
from tests.integration.test_webhooks import add_endpoint
from tests.support.harness import scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")

QUEUES = ["hooks-a", "hooks-b", "hooks-c", "hooks-d"]


def test_a_dispatcher_delivers_every_subscribed_event_of_tasks_on_both_nodes(citus, fresh, processes, receiver):  # noqa: F811
    url, db = fresh
    assert len({node_of_queue(db, q) for q in QUEUES}) == 2  # both nodes
    store = Store.pooled(url, max_size=2).open(wait=True)
    try:
        _, recorder = add_endpoint(store, receiver, "/hook", events=("task.queued", "task.completed"))
    finally:
        store.close()
    with TRACER.start_as_current_span("checkout") as checkout:  # the first task's enqueue is traced
        ids = [skiplock.enqueue(url, "t.record", {"n": 0}, queue=QUEUES[0])]
    ids += [skiplock.enqueue(url, "t.record", {"n": i}, queue=QUEUES[i % len(QUEUES)]) for i in range(1, 20)]
    worker = processes.spawn(url, "--concurrency", "4", "--queues", ",".join(QUEUES))
    processes.wait_ready(worker)
    dispatcher = processes.spawn(url, command="dispatcher", env={"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
                                                                 "SKIPLOCK_POLL_SECONDS": "0.2"})
    processes.wait_ready(dispatcher)
    try:
        wait_for(lambda: len(recorder.requests) >= 40, 60, interval=0.2, message="40 deliveries")
    except AssertionError:
        counts = db.execute("SELECT state, count(*) FROM skiplock.webhook_deliveries GROUP BY 1").fetchall()
        raise AssertionError(f"{len(recorder.requests)} delivered, {counts}:\n{dispatcher.log()[-2500:]}\n"
                             f"{worker.log()[-1500:]}") from None
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'") == 40,
             10, message="40 deliveries recorded delivered")
    bodies = [r["body"] for r in recorder.requests]
    assert len(bodies) == 40
    assert sorted((b["data"]["task_id"], b["type"]) for b in bodies) == \
        sorted((str(i), t) for i in ids for t in ("task.queued", "task.completed"))
    assert all(r["verified"] for r in recorder.requests)  # signed, as Standard Webhooks verifies
    for task_id in ids:
        types = [b["type"] for b in bodies if b["data"]["task_id"] == str(task_id)]
        assert types == ["task.queued", "task.completed"]
    # the traced task's deliveries carry its trace context as `traceparent`, read on its shard
    sent = [(r["body"]["data"]["task_id"], r["headers"].get("Traceparent")) for r in recorder.requests]
    assert sorted(h for t, h in sent if t == str(ids[0])) == [traceparent(checkout)] * 2
    assert {h for t, h in sent if t != str(ids[0])} == {None}

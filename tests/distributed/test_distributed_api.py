"""The API and the console on the distributed placement (a real `skiplock api` under gunicorn on the
coordinator): a task submitted over HTTP, read back by its id alone (which names no queue: the read
goes to every shard), its events, the queue listing, and the console's pages for a signed-in
admin. Each answers 200 with the task's data, never a 5xx. The event feed under them returns every
event of tasks on both nodes once, in commit order."""

from __future__ import annotations

import httpx
import pytest

import skiplock
from skiplock.engine.store import Store
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.distributed.test_distributed_faults import fresh  # noqa: F401  (the fixture)
from tests.integration.test_api import TOKENS
from tests.distributed.test_distributed_placement import QUEUES
from tests.support.harness import free_port, scalar, wait_for

pytestmark = pytest.mark.xdist_group("citus")

ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}
PAGES = ["/ui/", "/ui/tasks", "/ui/workers", "/ui/schedules", "/ui/signals", "/ui/limits", "/ui/webhooks",
         "/ui/deliveries", "/ui/audit"]


def test_a_task_over_http_read_by_id_its_events_the_queues_and_the_console(fresh, processes):  # noqa: F811
    url, db = fresh
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = start_api(processes, url, port)
    wait_ready(api, base)
    worker = processes.spawn(url, "--concurrency", "2", "--queues", "mail")
    processes.wait_ready(worker)
    with httpx.Client(base_url=base, headers=ADMIN, timeout=15) as client:
        created = client.post("/v1/tasks", json={"kind": "t.record", "queue": "mail", "payload": {"to": "a"}})
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        keyed = {"headers": {**ADMIN, "Idempotency-Key": "once"},
                 "json": {"kind": "t.record", "queue": "mail", "payload": {"to": "a"}}}
        again = client.post("/v1/tasks", **keyed)
        assert again.status_code == 201, again.text
        replay = client.post("/v1/tasks", **keyed)
        assert replay.status_code == 200 and replay.json()["id"] == again.json()["id"]
        wait_for(lambda: client.get(f"/v1/tasks/{task_id}").json()["state"] == "completed", 30,
                 message="the task completed")
        task = client.get(f"/v1/tasks/{task_id}").json()
        assert (task["queue"], task["kind"], task["payload"]) == ("mail", "t.record", {"to": "a"})
        events = client.get(f"/v1/tasks/{task_id}/events")
        assert events.status_code == 200
        assert [e["type"] for e in events.json()["events"]] == ["queued", "running", "completed"]
        queues = client.get("/v1/queues")
        assert queues.status_code == 200, queues.text
        mail = next(q for q in queues.json()["queues"] if q["name"] == "mail")
        assert mail["tasks"]["completed"] == 2
        console = httpx.Client(base_url=base, timeout=15, follow_redirects=True)
        login = console.get("/ui/login")
        csrf = login.text.split('name="csrf" value="')[1].split('"')[0]
        signed_in = console.post("/ui/login", data={"token": TOKENS["admin"], "csrf": csrf})
        assert signed_in.status_code == 200, api.log()[-2500:]
        for page in [*PAGES, f"/ui/tasks/{task_id}"]:
            answer = console.get(page)
            assert answer.status_code == 200, f"{page}: {answer.status_code} {api.log()[-2500:]}"
        assert task_id in console.get(f"/ui/tasks/{task_id}").text
        console.close()


def test_the_event_feed_returns_every_event_of_both_nodes_once_in_commit_order(fresh, processes):  # noqa: F811
    """The feed orders events by their writing transaction's id (migration 0024): here the
    coordinator's, which Citus gives the column's default wherever the row lands, and the horizon
    is the coordinator's snapshot."""
    url, db = fresh
    store = Store.pooled(url, max_size=2).open(wait=True)
    try:
        start = store.events.event_feed_read(None).cursor
        ids = []
        for queue in QUEUES:
            ids += skiplock.enqueue_many(url, "t.record", [{}] * 5, queue=queue)
        ids.append(skiplock.enqueue(url, "t.record", {}, queue=QUEUES[0]))
        worker = processes.spawn(url, "--concurrency", "4", "--queues", ",".join(QUEUES))
        processes.wait_ready(worker)
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == len(ids), 60,
                 message="every task completed")
        events, cursor = [], start
        for _ in range(20):
            page = store.events.event_feed_read(cursor, limit=25)
            events += page.events
            cursor = page.cursor
            if not page.events:
                break
        mine = store.events.event_feed_read(start, queue=QUEUES[1], limit=1000).events
    finally:
        store.close()
    assert len({(e.event.task_id, e.event.seq) for e in events}) == len(events) == 3 * len(ids)
    assert [e.cursor for e in events] == sorted(e.cursor for e in events)
    for task_id in ids:
        assert [e.event.type for e in events if e.event.task_id == task_id] == ["queued", "running", "completed"]
    assert {e.queue for e in events} == set(QUEUES)
    assert len(mine) == 15 and {e.queue for e in mine} == {QUEUES[1]}

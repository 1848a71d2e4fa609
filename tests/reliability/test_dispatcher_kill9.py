"""Real `skiplock dispatcher` processes against a real receiver: kill -9 mid-delivery loses
nothing (every committed event reaches the receiver, counted by webhook-id) and duplicates only
what was in flight; two dispatchers drain 2,000 deliveries without a duplicate; SIGTERM drains
or releases what is in flight and exits 0."""

from __future__ import annotations

import collections
import json
import signal

import pytest

import skiplock
from skiplock.engine.model import Settlement
from tests.support.harness import metric, scalar, wait_exit, wait_for
from tests.support.webhook_receiver import Receiver, subscribe

ENV = {"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8", "SKIPLOCK_WEBHOOK_LEASE_SECONDS": "3",
       "SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS": "2", "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": "1",
       "SKIPLOCK_POLL_SECONDS": "0.2"}


@pytest.fixture
def receiver_server(receiver):
    """The HTTP server (tests/conftest.py `receiver`); here `receiver` names the Receiver handler."""
    return receiver


def complete_tasks(store, db_url, n: int) -> None:
    """n committed task.completed transitions (one claim, one settle)."""
    skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(n)])
    tasks = store.tasks.task_claim(["default"], n, "w", 60)
    assert len(tasks) == n
    applied = store.tasks.task_settle([Settlement(t.id, t.lease_token, "completed", result={"ok": True}) for t in tasks])
    assert len(applied) == n


def owned_by(pid: int) -> str:
    return f"%:{pid}:%"


def test_kill_9_mid_delivery_loses_nothing_and_duplicates_only_in_flight(store, db_url, db, processes,
                                                                         receiver_server):
    receiver = Receiver(delay=0.02)
    subscribe(store, receiver_server, receiver)
    complete_tasks(store, db_url, 300)
    event_ids = {str(r[0]) for r in db.execute("SELECT event_id FROM skiplock.webhook_deliveries")}
    assert len(event_ids) == 300

    env = {**ENV, "SKIPLOCK_WEBHOOK_CONCURRENCY": "4"}
    first = processes.spawn(db_url, command="dispatcher", env=env)
    wait_for(lambda: receiver.count() >= 40, 30, interval=0.005, message="the first deliveries")
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    at_kill = receiver.count()
    # what the dead dispatcher held: claimed, maybe sent, never settled
    in_flight = {str(r[0]) for r in db.execute(
        "SELECT event_id FROM skiplock.webhook_deliveries WHERE state = 'delivering' AND lease_owner LIKE %s",
        (owned_by(first.pid),))}
    delivered_at_kill = scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'")
    assert 0 < delivered_at_kill < 300 and at_kill < 300, "the drain ended before the kill: nothing was tested"
    assert len(in_flight) <= 4

    second = processes.spawn(db_url, command="dispatcher", env=env)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'") == 300,
             60, interval=0.1, message="all 300 deliveries delivered")
    assert second.alive()

    counts = collections.Counter(receiver.received)
    assert set(counts) == event_ids  # every committed event reached the receiver: none lost
    duplicated = {i for i, n in counts.items() if n > 1}
    assert duplicated <= in_flight, f"duplicates of deliveries not in flight at the kill: {duplicated - in_flight}"
    assert all(n <= 2 for n in counts.values())
    print(f"received at kill {at_kill}, in flight {len(in_flight)}, duplicated {len(duplicated)}")
    # the in-flight ones were taken over after their lease, and their killed attempt not counted
    rows = db.execute("SELECT state, attempts, lease_owner FROM skiplock.webhook_deliveries "
                      "WHERE event_id = ANY(%s::uuid[])", (list(in_flight),)).fetchall()
    assert all(r == ("delivered", 1, None) for r in rows), rows
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE attempts <> 1") == 0


def test_two_dispatchers_drain_2000_deliveries_without_duplicates(store, db_url, db, processes, receiver_server):
    receiver = Receiver()
    endpoint = subscribe(store, receiver_server, receiver)
    env = {**ENV, "SKIPLOCK_WEBHOOK_LEASE_SECONDS": "30", "SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS": "5"}
    dispatchers = [processes.spawn(db_url, command="dispatcher", env=env) for _ in range(2)]
    for d in dispatchers:
        processes.wait_ready(d)
    db.execute("""
        INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload)
        SELECT gen_random_uuid(), %s, 'task.completed', jsonb_build_object('type', 'task.completed', 'n', n)
        FROM generate_series(1, 2000) AS n""", (endpoint.id,))
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'")
             == 2000, 60, interval=0.1, message="2,000 deliveries delivered")

    counts = collections.Counter(receiver.received)
    event_ids = {str(r[0]) for r in db.execute("SELECT event_id FROM skiplock.webhook_deliveries")}
    assert set(counts) == event_ids and len(event_ids) == 2000
    assert sum(counts.values()) == 2000, "a delivery was sent twice although no lease expired"
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE attempts <> 1") == 0
    # both took part; each counted exactly what it delivered, and no write was refused
    delivered = [metric(d.metrics_port, "skiplock_webhook_deliveries_total", outcome="delivered") or 0
                 for d in dispatchers]
    assert sum(delivered) == 2000 and all(n > 0 for n in delivered), delivered
    for d in dispatchers:
        assert not metric(d.metrics_port, "skiplock_stale_writes_rejected_total")
    for d in dispatchers:
        d.signal(signal.SIGTERM)
    assert [wait_exit(d, 20)[0] for d in dispatchers] == [0, 0]


def test_sigterm_mid_drain_exits_0_and_releases_what_it_holds(store, db_url, db, processes, receiver_server):
    receiver = Receiver(delay=1.5)  # longer than the 1 s grace: these sends cannot finish while draining
    subscribe(store, receiver_server, receiver)
    complete_tasks(store, db_url, 100)
    proc = processes.spawn(db_url, command="dispatcher", env=ENV)
    wait_for(lambda: len(receiver.started) >= 16, 30, interval=0.01, message="16 sends in flight")
    held = scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivering' "
                      "AND lease_owner LIKE %s", (owned_by(proc.pid),))
    assert held > 0
    proc.signal(signal.SIGTERM)
    code, _ = wait_exit(proc, 20)
    assert code == 0, proc.log()[-3000:]
    # nothing is left leased to the stopped dispatcher
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivering'") == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE lease_owner IS NOT NULL") == 0
    states = dict(db.execute("SELECT state, count(*) FROM skiplock.webhook_deliveries GROUP BY 1").fetchall())
    assert set(states) <= {"pending", "delivered"} and sum(states.values()) == 100
    # released attempts are given back: no pending delivery counts an attempt
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'pending' "
                      "AND attempts > 0") == 0
    (stopped,) = [json.loads(line) for line in proc.log().splitlines()
                  if line.startswith("{") and json.loads(line).get("msg") == "dispatcher stopped"]
    assert stopped["released"] > 0 and stopped["stale"] == 0
    assert stopped["delivered"] == states.get("delivered", 0)
    assert stopped["released"] + stopped["delivered"] <= 16 * 2

    # another dispatcher sends the released ones (and the rest)
    second = processes.spawn(db_url, command="dispatcher", env=ENV)
    receiver.delay = 0
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'") == 100,
             60, interval=0.1, message="all 100 delivered")
    assert set(receiver.received) == {str(r[0]) for r in db.execute("SELECT event_id FROM skiplock.webhook_deliveries")}
    second.signal(signal.SIGTERM)
    assert wait_exit(second, 20)[0] == 0

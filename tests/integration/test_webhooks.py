"""The outbox and the dispatcher against a real Postgres and real HTTP receivers on 127.0.0.1:
fan-out in the transition's transaction, signing, retries, the dead letter, 410, Retry-After,
redirects, hanging receivers and the SSRF guard at delivery time. The dispatcher runs in this
process, one `run_once()` at a time; no test waits for a retry delay (next_attempt_at is moved
to now() instead)."""

from __future__ import annotations

import datetime as dt
import json
import signal
import socket
import threading
import time
import uuid
from contextlib import contextmanager

import psycopg
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

import skiplock
from skiplock.dispatcher.dispatcher import Dispatcher
from skiplock.engine import webhooks as webhooks_module
from skiplock.engine.model import Settlement
from skiplock.engine.settings import Settings
from skiplock.engine.store import Store
from skiplock.engine.webhooks import generate_secret
from tests.support.harness import scalar, wait_for
from tests.unit.test_webhooks import verify_standard_webhook

LOCAL = ("127.0.0.0/8",)


def make_settings(**overrides) -> Settings:
    values = dict(webhook_allowed_networks=LOCAL, webhook_retry_base_seconds=0.01, webhook_timeout_seconds=5.0)
    values.update(overrides)
    return Settings.from_env({}, **values)


@contextmanager
def dispatcher(store: Store, **overrides):
    d = Dispatcher(make_settings(**overrides), store)
    try:
        yield d
    finally:
        d.pool.shutdown(wait=True)
        d.sender.close()


class Recorder:
    """A receiver handler: records every request, verifies its signature with the independent
    verifier, and answers with the next of `answers` (the last one repeats)."""

    def __init__(self, secret: str, answers=(200,)):
        self.secret = secret
        self.answers = list(answers)
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Response:
        body = request.get_data()
        with self.lock:
            n = len(self.requests)
            self.requests.append({
                "id": request.headers.get("webhook-id"),
                "timestamp": request.headers.get("webhook-timestamp"),
                "signature": request.headers.get("webhook-signature"),
                "verified": verify_standard_webhook(self.secret, dict(request.headers), body),
                "body": json.loads(body) if body else None,
                "headers": dict(request.headers),
            })
        answer = self.answers[min(n, len(self.answers) - 1)]
        if isinstance(answer, Response):
            return answer
        return Response("nope" if answer >= 300 else "", status=answer)

    @property
    def ids(self) -> list[str]:
        return [r["id"] for r in self.requests]


def add_endpoint(store: Store, receiver: HTTPServer, path: str, events=("task.*",), answers=(200,)):
    """An endpoint at `path` of the receiver, and the Recorder answering there."""
    secret = generate_secret()
    endpoint = store.webhooks.webhook_endpoint_insert(f"http://127.0.0.1:{receiver.port}{path}", list(events), secret)
    recorder = Recorder(secret, answers)
    receiver.expect_request(path, method="POST").respond_with_handler(recorder)
    return endpoint, recorder


def complete(store: Store, db_url: str, result=None, kind: str = "t.noop") -> uuid.UUID:
    task_id = skiplock.enqueue(db_url, kind, {})
    (task,) = store.tasks.task_claim(["default"], 1, "w", 30)
    assert task.id == task_id
    assert store.tasks.task_settle([Settlement(task_id, task.lease_token, "completed", result=result)]) == \
        {task_id: "completed"}
    return task_id


def make_due(db) -> None:
    db.execute("UPDATE skiplock.webhook_deliveries SET next_attempt_at = now() WHERE state = 'pending'")


def delivery_rows(db, endpoint_id=None):
    return db.execute(
        "SELECT id, event_id, event_type, state, attempts, last_status, last_error, lease_owner "
        "FROM skiplock.webhook_deliveries WHERE %(e)s::uuid IS NULL OR endpoint_id = %(e)s ORDER BY created_at, id",
        {"e": endpoint_id}).fetchall()


def trigger_state(db) -> str | None:
    """'O' while the outbox trigger fires, None while it does not exist."""
    row = db.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = 'task_events_outbox'").fetchone()
    return None if row is None else row[0]


def event_id(task_id, seq) -> str:
    import hashlib

    return str(uuid.UUID(hashlib.md5(f"{task_id}:{seq}".encode()).hexdigest()))


# ---- fan-out --------------------------------------------------------------------------------------

def test_fan_out_one_delivery_per_matching_enabled_endpoint_per_event(store, db_url, db, receiver):
    completed_only, _ = add_endpoint(store, receiver, "/a", events=["task.completed"])
    failures, _ = add_endpoint(store, receiver, "/b", events=["task.failed", "task.retrying"])
    everything, _ = add_endpoint(store, receiver, "/c", events=["task.*"])
    disabled, _ = add_endpoint(store, receiver, "/d", events=["task.*"])
    store.webhooks.webhook_endpoint_set_enabled(disabled.id, False, reason="test")

    done = complete(store, db_url, result={"n": 1})
    flaky = skiplock.enqueue(db_url, "t.noop", {}, max_attempts=5)
    (t,) = store.tasks.task_claim(["default"], 1, "w", 30)
    store.tasks.task_settle([Settlement(flaky, t.lease_token, "retry", error="flaky", delay=0)])
    (t,) = store.tasks.task_claim(["default"], 1, "w", 30)
    store.tasks.task_settle([Settlement(flaky, t.lease_token, "failed", error="broken")])

    def counts(endpoint):
        return dict(db.execute("SELECT event_type, count(*) FROM skiplock.webhook_deliveries "
                               "WHERE endpoint_id = %s GROUP BY 1", (endpoint.id,)).fetchall())

    assert counts(completed_only) == {"task.completed": 1}
    assert counts(failures) == {"task.retrying": 1, "task.failed": 1}
    assert counts(everything) == {"task.queued": 2, "task.running": 3, "task.completed": 1,
                                  "task.retrying": 1, "task.failed": 1}
    assert counts(disabled) == {}
    # exactly one delivery per (event, endpoint); the task.* endpoint has one per task event
    assert scalar(db, "SELECT count(*) FROM (SELECT event_id, endpoint_id FROM skiplock.webhook_deliveries "
                      "GROUP BY 1, 2 HAVING count(*) > 1) AS dup") == 0
    events = {event_id(task_id, seq) for task_id, seq in db.execute("SELECT task_id, seq FROM skiplock.task_events")}
    assert {str(r[1]) for r in delivery_rows(db, everything.id)} == events
    assert len(events) == 8
    # the same event has the same id at every endpoint
    (completed_event,) = [str(r[1]) for r in delivery_rows(db, completed_only.id)]
    assert completed_event == event_id(done, 3)
    assert scalar(db, "SELECT count(DISTINCT endpoint_id) FROM skiplock.webhook_deliveries WHERE event_id = %s",
                  (completed_event,)) == 2
    assert store.webhooks.outbox_stats()[0] == 1 + 2 + 8
    assert [(w.url.rsplit("/", 1)[1], w.pending) for w in store.webhooks.webhook_endpoint_list()] == \
        [("a", 1), ("b", 2), ("c", 8), ("d", 0)]


def test_bulk_enqueue_by_copy_fans_out_too(store, db_url, db, receiver):
    endpoint, _ = add_endpoint(store, receiver, "/q", events=["task.queued"])
    skiplock.enqueue_many(db_url, "t.noop", [{}] * 100)  # over the COPY threshold
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE endpoint_id = %s",
                  (endpoint.id,)) == 100


def test_no_enabled_endpoint_means_no_trigger_and_no_rows(store, db_url, db, receiver):
    assert trigger_state(db) is None
    complete(store, db_url)
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0

    endpoint, _ = add_endpoint(store, receiver, "/x")
    assert trigger_state(db) == "O"
    store.webhooks.webhook_endpoint_set_enabled(endpoint.id, False, reason="paused by test")
    assert trigger_state(db) is None
    complete(store, db_url)
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0
    (listed,) = store.webhooks.webhook_endpoint_list()
    assert (listed.enabled, listed.disabled_reason) == (False, "paused by test")

    store.webhooks.webhook_endpoint_set_enabled(endpoint.id, True)
    assert trigger_state(db) == "O"
    assert store.webhooks.webhook_endpoint_get(endpoint.id).disabled_reason is None
    complete(store, db_url)
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 3  # queued, running, completed

    store.webhooks.webhook_endpoint_delete(endpoint.id)
    assert trigger_state(db) is None
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0  # removed with the endpoint


def test_rolled_back_transition_leaves_no_delivery(store, db_url, db, receiver):
    endpoint, _ = add_endpoint(store, receiver, "/x", events=["task.completed"])
    task_id = skiplock.enqueue(db_url, "t.noop", {})
    (task,) = store.tasks.task_claim(["default"], 1, "w", 30)

    with psycopg.connect(db_url) as conn:  # not autocommit: the settle is inside our transaction
        with pytest.raises(RuntimeError, match="changed my mind"):
            with conn.transaction():
                applied = store.tasks.task_settle([Settlement(task_id, task.lease_token, "completed", result=1)], conn=conn)
                assert applied == {task_id: "completed"}
                # the delivery exists inside the transition's transaction, and nowhere else
                assert conn.execute("SELECT count(*) FROM skiplock.webhook_deliveries").fetchone()[0] == 1
                assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0
                raise RuntimeError("changed my mind")
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries") == 0
    assert scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "running"
    with dispatcher(store) as d:
        assert d.run_once() == {}

    # the same transition committed: exactly one delivery
    assert store.tasks.task_settle([Settlement(task_id, task.lease_token, "completed", result=1)]) == {task_id: "completed"}
    assert [(r[2], r[3]) for r in delivery_rows(db, endpoint.id)] == [("task.completed", "pending")]


# ---- delivery, signing, retries -------------------------------------------------------------------

def test_signed_delivery_keeps_its_webhook_id_across_retries(store, db_url, db, receiver):
    endpoint, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"], answers=(500, 500, 200))
    task_id = complete(store, db_url, result={"answer": 42})
    (delivery,) = delivery_rows(db)

    outcomes = []
    with dispatcher(store) as d:
        for _ in range(3):
            make_due(db)
            outcomes.append(d.run_once())
        make_due(db)
        assert d.run_once() == {}  # nothing left to send
    assert outcomes == [{"retry": 1}, {"retry": 1}, {"delivered": 1}]

    assert len(recorder.requests) == 3
    expected_id = event_id(task_id, 3)
    assert str(delivery[1]) == expected_id
    assert recorder.ids == [expected_id] * 3
    assert all(r["verified"] for r in recorder.requests), recorder.requests
    for r in recorder.requests:
        assert r["signature"].startswith("v1,")
        assert abs(int(r["timestamp"]) - time.time()) < 300
        assert r["headers"]["Content-Type"] == "application/json"
        assert r["headers"]["Host"] == f"127.0.0.1:{receiver.port}"
        assert r["body"]["type"] == "task.completed"
        assert r["body"]["data"]["task_id"] == str(task_id)
        assert r["body"]["data"]["result"] == {"answer": 42}
    row = db.execute("SELECT state, attempts, last_status, last_error, delivered_at IS NOT NULL, lease_owner "
                     "FROM skiplock.webhook_deliveries WHERE id = %s", (delivery[0],)).fetchone()
    assert row == ("delivered", 3, 200, None, True, None)
    assert store.webhooks.webhook_endpoint_get(endpoint.id).pending == 0


def test_rotated_secret_signs_the_next_attempt(store, db_url, db, receiver):
    endpoint, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"], answers=(500, 200))
    complete(store, db_url)
    with dispatcher(store) as d:
        assert d.run_once() == {"retry": 1}
        new_secret = generate_secret()
        store.webhooks.webhook_endpoint_set_secret(endpoint.id, new_secret)
        make_due(db)
        assert d.run_once() == {"delivered": 1}
    first, second = recorder.requests
    assert first["verified"] and not second["verified"]
    assert verify_standard_webhook(new_secret, second["headers"], json.dumps(
        second["body"], separators=(",", ":"), sort_keys=True).encode())


def test_dead_letter_after_12_attempts_then_redeliver(store, db_url, db, receiver):
    endpoint, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"],
                                      answers=[Response("still broken", status=500)])
    complete(store, db_url)
    (delivery,) = delivery_rows(db)
    with dispatcher(store) as d:
        assert d.settings.webhook_max_attempts == 12
        for n in range(1, 13):
            make_due(db)
            assert d.run_once() == ({"retry": 1} if n < 12 else {"dead": 1}), n
            state, attempts = db.execute("SELECT state, attempts FROM skiplock.webhook_deliveries").fetchone()
            assert (state, attempts) == ("pending" if n < 12 else "dead", n)
        make_due(db)
        assert d.run_once() == {}  # a dead delivery is never claimed
        assert len(recorder.requests) == 12
        assert set(recorder.ids) == {str(delivery[1])}

        (dead,) = store.webhooks.webhook_delivery_list(state="dead")
        assert (dead.id, dead.attempts, dead.last_status, dead.last_error) == \
            (delivery[0], 12, 500, "HTTP 500: still broken")
        assert store.webhooks.webhook_endpoint_get(endpoint.id).dead == 1

        # the receiver is fixed; an operator sends the dead letter again
        recorder.answers = [200]
        assert store.webhooks.webhook_delivery_redeliver(delivery_id=delivery[0]) == 1
        assert store.webhooks.webhook_delivery_redeliver(delivery_id=delivery[0]) == 0  # no longer dead
        row = db.execute("SELECT state, attempts FROM skiplock.webhook_deliveries").fetchone()
        assert row == ("pending", 0)
        assert d.run_once() == {"delivered": 1}
    assert len(recorder.requests) == 13 and recorder.ids[-1] == str(delivery[1])
    assert db.execute("SELECT state, attempts, last_status FROM skiplock.webhook_deliveries").fetchone() == \
        ("delivered", 1, 200)


def test_redeliver_all_dead_of_an_endpoint(store, db_url, db, receiver):
    endpoint, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"], answers=(500,))
    for _ in range(3):
        complete(store, db_url)
    with dispatcher(store, webhook_max_attempts=1) as d:
        assert d.run_once() == {"dead": 3}
        recorder.answers = [200]
        assert store.webhooks.webhook_delivery_redeliver(endpoint_id=endpoint.id) == 3
        assert store.webhooks.webhook_delivery_redeliver(endpoint_id=endpoint.id) == 0
        assert d.run_once() == {"delivered": 3}


def test_410_disables_the_endpoint_and_its_other_deliveries_wait(store, db_url, db, receiver):
    gone, gone_recorder = add_endpoint(store, receiver, "/gone", events=["task.completed"], answers=(410,))
    fine, fine_recorder = add_endpoint(store, receiver, "/fine", events=["task.completed"])
    for _ in range(3):
        complete(store, db_url)
    with dispatcher(store, webhook_concurrency=1) as d:
        results = []
        while True:
            did = d.run_once()
            if not did:
                break
            results.append(did)
    assert len(gone_recorder.requests) == 1  # the first 410 disabled it: the other two were not sent
    assert len(fine_recorder.requests) == 3
    assert sorted(k for r in results for k in r) == ["delivered"] * 3 + ["gone"]

    endpoint = store.webhooks.webhook_endpoint_get(gone.id)
    assert endpoint.enabled is False and "410" in endpoint.disabled_reason
    rows = delivery_rows(db, gone.id)
    dead = [r for r in rows if r[3] == "dead"]
    assert len(dead) == 1 and dead[0][5] == 410 and str(dead[0][1]) == gone_recorder.ids[0]
    assert sorted((r[3], r[4]) for r in rows if r[3] != "dead") == [("pending", 0), ("pending", 0)]
    assert trigger_state(db) == "O"  # the other endpoint still subscribes
    # new events no longer fan out to the disabled endpoint
    complete(store, db_url)
    assert len(delivery_rows(db, gone.id)) == 3 and len(delivery_rows(db, fine.id)) == 4

    # re-enabled (the receiver is back): the waiting deliveries go out
    gone_recorder.answers = [200]
    store.webhooks.webhook_endpoint_set_enabled(gone.id, True)
    with dispatcher(store) as d:
        assert d.run_once() == {"delivered": 3}  # two waiting for /gone, one new for /fine
    assert len(gone_recorder.requests) == 3


def test_retry_after_is_honoured_and_capped(store, db_url, db, receiver):
    slow, _ = add_endpoint(store, receiver, "/slow", events=["task.completed"],
                           answers=[Response("", status=429, headers={"Retry-After": "120"})])
    busy, _ = add_endpoint(store, receiver, "/busy", events=["task.completed"],
                           answers=[Response("", status=503, headers={"Retry-After": "100000"})])
    complete(store, db_url)
    with dispatcher(store) as d:
        assert d.run_once() == {"retry": 2}

    def wait_seconds(endpoint):
        return scalar(db, "SELECT extract(epoch FROM next_attempt_at - now())::float8 "
                          "FROM skiplock.webhook_deliveries WHERE endpoint_id = %s", (endpoint.id,))

    assert 120 - 5 <= wait_seconds(slow) <= 120 + 1
    assert 21600 - 5 <= wait_seconds(busy) <= 21600 + 1  # capped by SKIPLOCK_WEBHOOK_RETRY_CAP_SECONDS (6 h)
    assert [r[5] for r in delivery_rows(db, slow.id)] == [429] and [r[5] for r in delivery_rows(db, busy.id)] == [503]
    with dispatcher(store) as d:
        assert d.run_once() == {}  # not due


def test_redirects_are_not_followed_and_count_as_a_retry(store, db_url, db, receiver):
    elsewhere_hits = []
    receiver.expect_request("/elsewhere").respond_with_handler(
        lambda request: (elsewhere_hits.append(1), Response("", status=200))[1])
    _, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"], answers=[Response(
        "", status=302, headers={"Location": f"http://127.0.0.1:{receiver.port}/elsewhere"})])
    complete(store, db_url)
    with dispatcher(store) as d:
        assert d.run_once() == {"retry": 1}
    assert len(recorder.requests) == 1 and elsewhere_hits == []
    ((status, error),) = db.execute("SELECT last_status, last_error FROM skiplock.webhook_deliveries").fetchall()
    assert status == 302 and "/elsewhere not followed" in error


def test_a_hanging_receiver_is_cut_off_at_the_timeout(store, db_url, db, receiver):
    release = threading.Event()

    def hang(request):
        release.wait(20)
        return Response("", status=200)

    receiver.expect_request("/hang", method="POST").respond_with_handler(hang)
    store.webhooks.webhook_endpoint_insert(f"http://127.0.0.1:{receiver.port}/hang", ["task.completed"], generate_secret())
    complete(store, db_url)
    try:
        with dispatcher(store, webhook_timeout_seconds=1.0) as d:
            started = time.monotonic()
            assert d.run_once() == {"retry": 1}
            assert time.monotonic() - started < 10
    finally:
        release.set()
    ((state, status, error),) = db.execute(
        "SELECT state, last_status, last_error FROM skiplock.webhook_deliveries").fetchall()
    assert state == "pending" and status is None and "timed out" in error


@pytest.fixture
def trickler():
    """A raw TCP receiver that sends a status line, then one header line every 0.25 s for 5 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    for i in range(20):
                        if stop.wait(0.25):
                            break
                        conn.sendall(f"x-slow-{i}: y\r\n".encode())
                    conn.sendall(b"content-length: 0\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def test_a_trickling_receiver_is_cut_off_at_the_total_timeout(store, db_url, db, trickler):
    store.webhooks.webhook_endpoint_insert(f"http://127.0.0.1:{trickler}/slow", ["task.completed"], generate_secret())
    complete(store, db_url)
    with dispatcher(store, webhook_timeout_seconds=1.0) as d:
        started = time.monotonic()
        d.run_once()
        elapsed = time.monotonic() - started
    assert elapsed < 3.5, f"one attempt took {elapsed:.1f}s with a 1s timeout"


# ---- the SSRF guard at delivery time, and bad endpoints that must not crash the dispatcher ---------

def test_the_guard_refuses_at_delivery_time_without_the_allow_list(store, db_url, db, receiver):
    _, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"])  # added while allowed
    complete(store, db_url)
    with dispatcher(store, webhook_allowed_networks=()) as d:
        assert d.run_once() == {"retry": 1}
    assert recorder.requests == [] and receiver.log == []
    ((state, attempts, status, error),) = db.execute(
        "SELECT state, attempts, last_status, last_error FROM skiplock.webhook_deliveries").fetchall()
    assert (state, attempts, status) == ("pending", 1, None)
    assert "127.0.0.1, which is not a public address" in error
    # allowed again: delivered
    make_due(db)
    with dispatcher(store) as d:
        assert d.run_once() == {"delivered": 1}
    assert len(recorder.requests) == 1


def test_a_name_resolving_to_loopback_is_refused_at_delivery(store, db_url, db, receiver, monkeypatch):
    """DNS changed after the endpoint was created: the address is checked again at every attempt."""
    _, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"])
    db.execute("UPDATE skiplock.webhook_endpoints SET url = %s", (f"http://hooks.example.test:{receiver.port}/hook",))
    real = socket.getaddrinfo

    def fake_getaddrinfo(host, port, *args, **kwargs):
        if host == "hooks.example.test":
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(webhooks_module.socket, "getaddrinfo", fake_getaddrinfo)
    complete(store, db_url)
    with dispatcher(store, webhook_allowed_networks=()) as d:
        assert d.run_once() == {"retry": 1}
    assert recorder.requests == []
    assert "hooks.example.test resolves to 127.0.0.1" in scalar(db, "SELECT last_error FROM skiplock.webhook_deliveries")
    # allowed: connects to the checked address, and speaks HTTP to the name
    make_due(db)
    with dispatcher(store) as d:
        assert d.run_once() == {"delivered": 1}
    assert recorder.requests[0]["headers"]["Host"] == f"hooks.example.test:{receiver.port}"


def test_unsendable_endpoints_and_garbage_answers_never_crash_the_dispatcher(store, db_url, db, receiver,
                                                                             monkeypatch):
    """Regression: a URL httpx refuses (a control character) or a Retry-After of '²' made
    Sender.send raise, which crashed run_once and the dispatcher loop with every claimed delivery
    of the batch stuck in 'delivering'. A non-ASCII host name is sent in its punycode form."""
    _, good = add_endpoint(store, receiver, "/good", events=["task.completed"])
    _, garbage = add_endpoint(store, receiver, "/garbage", events=["task.completed"],
                              answers=[Response("", status=503, headers={"Retry-After": "²"})])
    control = store.webhooks.webhook_endpoint_insert(f"http://127.0.0.1:{receiver.port}/a\x01b", ["task.completed"], generate_secret())
    _, idn_recorder = add_endpoint(store, receiver, "/x", events=["task.completed"])
    idn = store.webhooks.webhook_endpoint_insert(f"http://bücher.example.test:{receiver.port}/x", ["task.completed"], generate_secret())
    real = socket.getaddrinfo
    monkeypatch.setattr(webhooks_module.socket, "getaddrinfo", lambda host, port, *a, **k: real(
        "127.0.0.1" if host == "xn--bcher-kva.example.test" else host, port, *a, **k))
    complete(store, db_url)
    with dispatcher(store) as d:
        assert d.run_once() == {"delivered": 3, "retry": 2}
    assert len(good.requests) == 1 and len(garbage.requests) == 1
    assert sorted(r["headers"]["Host"] for r in idn_recorder.requests) == \
        sorted([f"127.0.0.1:{receiver.port}", f"xn--bcher-kva.example.test:{receiver.port}"])
    rows = {r[0]: r for r in db.execute("SELECT endpoint_id, state, attempts, last_status, last_error "
                                        "FROM skiplock.webhook_deliveries").fetchall()}
    assert rows[control.id][1:3] == ("pending", 1) and "InvalidURL" in rows[control.id][4]
    assert rows[idn.id][1:3] == ("delivered", 1)
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivering'") == 0


# ---- payload ------------------------------------------------------------------------------------------

def test_payload_matches_the_task_and_its_event(store, db_url, db, receiver):
    _, recorder = add_endpoint(store, receiver, "/all", events=["task.*"])
    done = skiplock.enqueue(db_url, "t.noop", {"a": 1}, queue="q1")
    (t,) = store.tasks.task_claim(["q1"], 1, "w", 30)
    store.tasks.task_settle([Settlement(done, t.lease_token, "completed", result={"out": [1, 2]})])
    failed = skiplock.enqueue(db_url, "t.record", {}, queue="q2", max_attempts=3)
    (t,) = store.tasks.task_claim(["q2"], 1, "w", 30)
    store.tasks.task_settle([Settlement(failed, t.lease_token, "retry", error="flaky", delay=0)])
    (t,) = store.tasks.task_claim(["q2"], 1, "w", 30)
    store.tasks.task_settle([Settlement(failed, t.lease_token, "failed", error="broken for good")])
    cancelled = skiplock.enqueue(db_url, "t.noop", {}, queue="q3")
    assert store.tasks.task_cancel(cancelled) == "cancelled"

    events = db.execute("""
        SELECT e.task_id, e.seq, e.type, e.attempt, e.at, t.kind, t.queue
        FROM skiplock.task_events e JOIN skiplock.tasks t ON t.id = e.task_id ORDER BY e.task_id, e.seq""").fetchall()
    deliveries = {str(r[0]): (r[1], r[2]) for r in db.execute(
        "SELECT event_id, event_type, payload FROM skiplock.webhook_deliveries").fetchall()}
    assert len(deliveries) == len(events) == 3 + 5 + 2
    final_state = {done: "completed", failed: "failed", cancelled: "cancelled"}
    for task_id, seq, type_, attempt, at, kind, queue in events:
        event_type, payload = deliveries[event_id(task_id, seq)]
        assert event_type == payload["type"] == f"task.{type_}"
        data = payload["data"]
        assert data["task_id"] == str(task_id) and data["kind"] == kind and data["queue"] == queue
        assert data["seq"] == seq and data.get("attempt") == attempt
        assert data["state"] in ("queued", "running", final_state[task_id])
        assert dt.datetime.fromisoformat(payload["timestamp"]) == at
        if type_ == "completed":
            assert data["result"] == {"out": [1, 2]}
        else:
            assert "result" not in data
        if type_ == "retrying":
            assert data["error"] == "flaky"
        elif type_ == "failed":
            assert data["error"] == "broken for good"
        else:
            assert "error" not in data

    # what the receiver gets is the payload, byte for byte as JSON
    with dispatcher(store) as d:
        assert d.run_once() == {"delivered": 10}
    assert {r["id"]: r["body"] for r in recorder.requests} == {k: v[1] for k, v in deliveries.items()}
    assert all(r["verified"] for r in recorder.requests)


# ---- a real worker -------------------------------------------------------------------------------------

def test_a_real_worker_fans_out_each_event_once(store, db_url, db, receiver, processes):
    """The worker claims and settles on connections of its own, in parallel: each of its events
    fans out exactly once."""
    completed, _ = add_endpoint(store, receiver, "/done", events=["task.completed"])
    everything, _ = add_endpoint(store, receiver, "/all", events=["task.*"])
    ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * 40)
    worker = processes.spawn(db_url, "--concurrency", "4")
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == 40, 30,
             message="40 tasks completed")
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE endpoint_id = %s",
                  (completed.id,)) == 40
    by_type = dict(db.execute("SELECT event_type, count(*) FROM skiplock.webhook_deliveries WHERE endpoint_id = %s "
                              "GROUP BY 1", (everything.id,)).fetchall())
    assert by_type == {"task.queued": 40, "task.running": 40, "task.completed": 40}
    payload_ids = {r[0] for r in db.execute(
        "SELECT payload -> 'data' ->> 'task_id' FROM skiplock.webhook_deliveries WHERE endpoint_id = %s",
        (completed.id,))}
    assert payload_ids == {str(i) for i in ids}
    with dispatcher(store, webhook_concurrency=64) as d:
        total = {}
        while did := d.run_once():
            for k, v in did.items():
                total[k] = total.get(k, 0) + v
    assert total == {"delivered": 160}


def test_an_expired_attempt_of_a_disabled_endpoint_is_not_sent(store, db_url, db, receiver):
    endpoint, recorder = add_endpoint(store, receiver, "/hook", events=["task.completed"])
    complete(store, db_url)
    (held,) = store.webhooks.webhook_delivery_claim(1, "dead-dispatcher", 30)  # its dispatcher then dies
    store.webhooks.webhook_endpoint_set_enabled(endpoint.id, False, reason="receiver answered 410 Gone")
    db.execute("UPDATE skiplock.webhook_deliveries SET lease_until = now() - interval '1 second'")
    with dispatcher(store) as d:
        d.run_once()
    assert recorder.requests == []


def test_delivery_ids_are_time_ordered_uuid7(store, db_url, db, receiver):
    add_endpoint(store, receiver, "/hook", events=["task.completed"])
    for _ in range(5):
        complete(store, db_url)
    rows = db.execute("SELECT id, created_at FROM skiplock.webhook_deliveries ORDER BY id").fetchall()
    assert len(rows) == 5
    assert [r[0].version for r in rows] == [7] * 5
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)  # id order is creation order


def test_endpoint_changes_switch_the_outbox_trigger_only_when_needed(store, db):
    def trigger_enabled():
        return trigger_state(db) == "O"

    assert not trigger_enabled()
    a = store.webhooks.webhook_endpoint_insert("http://127.0.0.1:1/a", ["task.*"], generate_secret())
    b = store.webhooks.webhook_endpoint_insert("http://127.0.0.1:1/b", ["task.*"], generate_secret())
    assert trigger_enabled()
    # a transaction holding task_events does not block a change that switches nothing
    with psycopg.connect(db.info.dsn) as blocker:
        blocker.execute("LOCK TABLE skiplock.task_events IN ROW EXCLUSIVE MODE")
        store.webhooks.webhook_endpoint_set_enabled(a.id, False, reason="test")
        assert trigger_enabled()
        blocker.rollback()
    store.webhooks.webhook_endpoint_delete(b.id)
    assert not trigger_enabled()  # no enabled endpoint left: fan-out costs nothing


_OLD_DISABLED_TRIGGER = (
    "CREATE TRIGGER task_events_outbox AFTER INSERT ON skiplock.task_events "
    "REFERENCING NEW TABLE AS new_events FOR EACH STATEMENT EXECUTE FUNCTION skiplock.outbox_fan_out()")


@pytest.mark.parametrize("enabled", [False, True])
def test_migration_0008_drops_only_a_disabled_outbox_trigger(db_url, db, enabled):
    """Before 0008 the trigger was kept disabled while no endpoint was enabled; Postgres still
    copied every event row into its transition table. 0008 drops it then, and keeps an enabled one."""
    from skiplock.engine import migrate

    db.execute(_OLD_DISABLED_TRIGGER)
    if not enabled:
        db.execute("ALTER TABLE skiplock.task_events DISABLE TRIGGER task_events_outbox")
    db.execute("DELETE FROM skiplock.schema_migrations WHERE version = '0008'")
    assert [m.name for m in migrate.apply(db_url)] == ["outbox_trigger_on_demand"]
    assert trigger_state(db) == ("O" if enabled else None)


def test_a_trigger_disabled_by_hand_is_replaced_when_an_endpoint_is_enabled(store, db_url, db, receiver):
    db.execute(_OLD_DISABLED_TRIGGER)
    db.execute("ALTER TABLE skiplock.task_events DISABLE TRIGGER task_events_outbox")
    endpoint, _ = add_endpoint(store, receiver, "/x", events=["task.queued"])
    assert trigger_state(db) == "O"
    assert scalar(db, "SELECT count(*) FROM pg_trigger WHERE tgname = 'task_events_outbox'") == 1
    skiplock.enqueue(db_url, "t.noop", {})
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE endpoint_id = %s", (endpoint.id,)) == 1


def test_switching_the_trigger_off_behind_a_long_reader_gives_up_and_changes_nothing(store, db_url, db, receiver):
    """Dropping the trigger locks out readers of task_events too: behind a transaction that
    read them, the change waits at most its lock timeout (5 s), then is refused and rolled back."""
    from skiplock.engine.errors import DatabaseUnavailable

    endpoint, _ = add_endpoint(store, receiver, "/x")
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM skiplock.task_events")  # holds its lock until rollback
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match="long transaction; try again"):
            store.webhooks.webhook_endpoint_delete(endpoint.id)
        assert 4.5 < time.monotonic() - started < 15
        reader.rollback()
    assert [w.id for w in store.webhooks.webhook_endpoint_list()] == [endpoint.id]
    assert trigger_state(db) == "O"
    store.webhooks.webhook_endpoint_delete(endpoint.id)
    assert trigger_state(db) is None and store.webhooks.webhook_endpoint_list() == []


def test_an_endpoint_whose_deliveries_only_died_for_a_day_is_disabled_with_the_reason(store, db_url, db, receiver):
    """Issue 35: a receiver that is gone for good, not down for a deploy. Its deliveries died for a
    day with none delivered: disabled when the next one dies, with the reason and an audit row, and
    the outbox stops filling for it. One with a success within the day, and one added less than a
    day ago, are left enabled."""
    dying, _ = add_endpoint(store, receiver, "/dying", events=["task.completed"],
                            answers=[Response("down", status=500)])
    lately_ok, _ = add_endpoint(store, receiver, "/lately-ok", events=["task.completed"],
                                answers=[Response("down", status=500)])
    young, _ = add_endpoint(store, receiver, "/young", events=["task.completed"],
                            answers=[Response("down", status=500)])
    complete(store, db_url)
    # the history: the two older endpoints were added two days ago and a delivery of each died 25 h
    # ago; one of them delivered one 2 h ago. The young one was added an hour ago.
    db.execute("UPDATE skiplock.webhook_endpoints SET created_at = now() - interval '2 days' WHERE id = ANY(%s)",
               ([dying.id, lately_ok.id],))
    db.execute("UPDATE skiplock.webhook_endpoints SET created_at = now() - interval '1 hour' WHERE id = %s",
               (young.id,))
    for endpoint in (dying, lately_ok, young):
        db.execute("INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload, state, "
                   "attempts, created_at, updated_at) VALUES (gen_random_uuid(), %s, 'task.completed', '{}', 'dead', "
                   "12, now() - interval '2 days', now() - interval '25 hours')", (endpoint.id,))
    db.execute("INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload, state, attempts, "
               "delivered_at) VALUES (gen_random_uuid(), %s, 'task.completed', '{}', 'delivered', 1, "
               "now() - interval '2 hours')", (lately_ok.id,))

    with dispatcher(store, webhook_max_attempts=1) as d:  # this completion's deliveries die at once
        assert d.run_once() == {"dead": 3}

    rows = {r[0]: r[1:] for r in db.execute("SELECT id, enabled, disabled_reason FROM skiplock.webhook_endpoints")}
    assert rows[lately_ok.id] == (True, None) and rows[young.id] == (True, None)
    enabled, reason = rows[dying.id]
    assert not enabled and reason.startswith("every delivery died for 24.0 hours (none delivered since it was added)")
    audit = db.execute("SELECT actor, action, target, outcome, detail FROM skiplock.audit_log "
                       "WHERE action = 'webhook.disable'").fetchall()
    assert audit == [("dispatcher", "webhook.disable", str(dying.id), "ok", {"reason": reason})]
    assert store.webhooks.webhook_endpoint_get(dying.id).enabled is False
    # the next completion makes deliveries for the enabled endpoints only
    complete(store, db_url)
    assert {r[0] for r in db.execute("SELECT endpoint_id FROM skiplock.webhook_deliveries WHERE state = 'pending'")} \
        == {lately_ok.id, young.id}

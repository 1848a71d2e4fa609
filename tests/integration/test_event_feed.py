"""The task event feed over real HTTP (`skiplock api` under gunicorn, one worker) against a real
database: GET /v1/events (every event once, in order, filtered by queue, kind and task, resumed
after a cursor, a long-poll that answers as soon as an event commits), GET /v1/events/stream
(each event's cursor as its `id:`, resumed with Last-Event-ID, keep-alive comments, an end of
its own), the order under concurrent transactions (one committed out of order is not skipped, a
rolled-back one never appears, another database's does not hold the feed back), the tokens it
needs, the bound on feeds per worker (429 with Retry-After, while other requests still answer)
and the console's stream on its session."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import httpx
import psycopg
import pytest

import skiplock
from tests.acceptance.test_api_process import wait_ready
from tests.integration.test_api import CONSOLE_SESSION_KEY, TOKEN_CONFIG, TOKENS
from tests.integration.test_console import sign_in
from tests.support.harness import free_port, wait_for

READER = {"Authorization": f"Bearer {TOKENS['reader']}"}
ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}


@pytest.fixture
def serve(processes, db_url):
    """Starts `skiplock api` on this test's database: one gunicorn worker, `threads` threads;
    returns an httpx client on it."""
    clients = []

    def start(threads: int = 4, **env) -> httpx.Client:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = processes.spawn(db_url, "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", str(threads),
                               command="api", env={"SKIPLOCK_API_TOKENS": TOKEN_CONFIG, "SKIPLOCK_LOG_FORMAT": "text",
                                                   "SKIPLOCK_CONSOLE_SESSION_KEY": CONSOLE_SESSION_KEY, **env})
        wait_ready(proc, base)
        client = httpx.Client(base_url=base, headers=READER, timeout=15)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()


def feed(client: httpx.Client, **params) -> dict:
    r = client.get("/v1/events", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def insert_task(conn: psycopg.Connection, kind: str, queue: str = "default") -> str:
    """A task row written as SQL would (the trigger writes its `queued` event) in `conn`'s transaction."""
    task_id = str(uuid.uuid4())
    conn.execute("INSERT INTO skiplock.tasks (id, kind, queue) VALUES (%s, %s, %s)", (task_id, kind, queue))
    return task_id


class StreamReader:
    """Reads a Server-Sent Events stream in a thread: its messages (id, data) and comments, as
    they arrive, and the status and headers of the answer."""

    def __init__(self, client: httpx.Client, path: str = "/v1/events/stream", headers: dict | None = None,
                 **params):
        self.messages: list[dict] = []
        self.comments: list[str] = []
        self.response: httpx.Response | None = None
        self.started = threading.Event()
        self.ended = threading.Event()
        self.shut = False
        self._thread = threading.Thread(target=self._read, args=(client, path, headers or {}, params), daemon=True)
        self._thread.start()
        assert self.started.wait(10), "no answer from the stream"

    def _read(self, client, path, headers, params):
        try:
            with client.stream("GET", path, params=params, headers=headers) as response:
                if response.status_code != 200:
                    response.read()
                self.response = response
                self.started.set()
                if response.status_code == 200:
                    self._parse(response)
        except httpx.TransportError:
            if not self.shut:
                raise
        finally:
            self.started.set()
            self.ended.set()

    def _parse(self, response: httpx.Response) -> None:
        fields: dict = {}
        for line in response.iter_lines():
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
            elif line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
            elif fields:
                self.messages.append(fields)
                fields = {}

    def events(self) -> list[dict]:
        return [json.loads(m["data"]) for m in self.messages if "data" in m]

    def last_id(self) -> str:
        return [m["id"] for m in self.messages if "id" in m][-1]

    def close(self) -> None:
        """Leave as a browser does: the connection shut (closing the socket under the reading
        thread would send nothing until its read returned)."""
        self.shut = True
        if self.response is not None and not self.ended.is_set():
            self.response.extensions["network_stream"].get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        assert self.ended.wait(10)


def test_the_feed_gives_every_event_once_in_order_filtered_and_resumed(serve, db_url):
    client = serve()
    start = feed(client)
    assert start["events"] == [] and start["cursor"]
    mail = [skiplock.enqueue(db_url, "mail.send", {"n": n}, queue="mail") for n in range(3)]
    report = skiplock.enqueue(db_url, "reports.daily", {}, queue="reports")
    assert client.post(f"/v1/tasks/{mail[0]}/cancel", headers=ADMIN, json={}).status_code == 200

    every = feed(client, after=start["cursor"])["events"]
    assert [(e["task_id"], e["type"]) for e in every] == \
        [(str(t), "queued") for t in (*mail, report)] + [(str(mail[0]), "cancelled")]
    assert {e["queue"] for e in every} == {"mail", "reports"} and every[0]["kind"] == "mail.send"
    assert len({e["cursor"] for e in every}) == 5
    # from the oldest event the feed holds: the same five
    assert feed(client, after="0")["events"] == every

    # filters: queue, kind, task, and all three
    assert [e["task_id"] for e in feed(client, after=start["cursor"], queue="reports")["events"]] == [str(report)]
    assert len(feed(client, after=start["cursor"], kind="mail.send")["events"]) == 4
    assert [e["type"] for e in feed(client, after=start["cursor"], task=str(mail[0]))["events"]] == \
        ["queued", "cancelled"]
    assert feed(client, after=start["cursor"], queue="mail", kind="reports.daily")["events"] == []

    # two at a time, each read after the last one's cursor: the same events, none twice
    paged, cursor = [], start["cursor"]
    for _ in range(5):
        page = feed(client, after=cursor, limit=2)
        paged += page["events"]
        cursor = page["cursor"]
    assert paged == every and feed(client, after=cursor)["events"] == []
    # a filter that keeps nothing still moves its cursor past what it read: the next event is next
    nothing = feed(client, after=start["cursor"], queue="nosuch")
    assert nothing["events"] == [] and nothing["cursor"] != start["cursor"]
    later = skiplock.enqueue(db_url, "mail.send", {}, queue="nosuch")
    assert [e["task_id"] for e in feed(client, after=nothing["cursor"], queue="nosuch")["events"]] == [str(later)]

    r = client.get("/v1/events", params={"after": "yesterday"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "request.invalid")
    assert r.json()["error"]["message"].startswith("after 'yesterday': not a feed cursor"), r.text
    assert client.get("/v1/events", params={"limit": 0}).status_code == 400


def test_a_long_poll_answers_as_soon_as_an_event_commits(serve, db_url):
    client = serve()
    cursor = feed(client)["cursor"]
    answers = []
    poll = threading.Thread(target=lambda: answers.append((client.get("/v1/events", params={
        "after": cursor, "wait": 10}), time.monotonic())))
    poll.start()
    time.sleep(0.5)  # the long-poll is waiting (nothing to give)
    before_commit = time.monotonic()
    task_id = skiplock.enqueue(db_url, "mail.send", {})
    poll.join(15)
    [(r, answered)] = answers
    assert r.status_code == 200 and [e["task_id"] for e in r.json()["events"]] == [str(task_id)]
    print(f"long-poll answered {answered - before_commit:.3f} s after the commit began")
    assert answered - before_commit < 1.0
    # with nothing committing, it answers empty when its wait ends (cut to SKIPLOCK_API_MAX_WAIT_SECONDS)
    started = time.monotonic()
    quiet = feed(client, after=r.json()["cursor"], wait=1)
    assert quiet["events"] == [] and 0.9 < time.monotonic() - started < 5


def test_a_rolled_back_transactions_events_never_appear(serve, db_url):
    client = serve()
    cursor = feed(client)["cursor"]
    with psycopg.connect(db_url) as conn:
        rolled_back = insert_task(conn, "mail.send")
        waiting = threading.Thread(target=lambda: answers.append(feed(client, after=cursor, wait=10)))
        answers: list[dict] = []
        waiting.start()
        time.sleep(0.5)
        conn.rollback()
    kept = skiplock.enqueue(db_url, "mail.send", {})
    waiting.join(15)
    assert [e["task_id"] for e in answers[0]["events"]] == [str(kept)]
    assert [e["task_id"] for e in feed(client, after="0")["events"]] == [str(kept)]


def test_no_event_is_skipped_when_transactions_commit_out_of_order(serve, db_url):
    client = serve()
    cursor = feed(client)["cursor"]
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        early = insert_task(first, "order.first")  # begins first: the older transaction
        late = insert_task(second, "order.second")
        second.commit()  # ... but commits first
        # the late one is committed, yet not given while the older one may still commit: a
        # cursor past it would pass over the early one's event
        held = feed(client, after=cursor)
        assert held["events"] == []
        assert feed(client, after=cursor, wait=1)["events"] == []
        first.commit()
    read = feed(client, after=held["cursor"])["events"]
    assert [e["task_id"] for e in read] == [early, late]
    assert [e["task_id"] for e in feed(client, after=cursor)["events"]] == [early, late]


def test_a_transaction_of_another_database_does_not_hold_the_feed_back(serve, db_url, pg_server_url):
    client = serve()
    cursor = feed(client)["cursor"]
    with psycopg.connect(pg_server_url) as elsewhere, psycopg.connect(db_url) as here:
        assert elsewhere.info.dbname != here.info.dbname
        elsewhere.execute("SELECT pg_current_xact_id()")  # a transaction with an id, left open
        task_id = skiplock.enqueue(db_url, "mail.send", {})
        assert [e["task_id"] for e in feed(client, after=cursor)["events"]] == [str(task_id)]
        # one of this database holds it back for as long as it lasts
        here.execute("SELECT pg_current_xact_id()")
        held = feed(client, after=cursor)
        other = skiplock.enqueue(db_url, "mail.send", {})
        assert feed(client, after=held["cursor"])["events"] == []
        here.rollback()
    assert [e["task_id"] for e in feed(client, after=held["cursor"])["events"]] == [str(other)]


def test_the_stream_gives_events_with_their_cursor_as_id_and_resumes_with_last_event_id(serve, db_url):
    client = serve(SKIPLOCK_API_MAX_WAIT_SECONDS="3")
    stream = StreamReader(client, queue="mail")
    assert stream.response.status_code == 200
    assert stream.response.headers["content-type"].startswith("text/event-stream")
    first = [skiplock.enqueue(db_url, "mail.send", {"n": n}, queue="mail") for n in range(2)]
    skiplock.enqueue(db_url, "reports.daily", {}, queue="reports")  # filtered out
    wait_for(lambda: len(stream.events()) == 2, 10, message="two events on the stream")
    events = stream.events()
    assert [e["task_id"] for e in events] == [str(t) for t in first]
    assert [m["id"] for m in stream.messages if "data" in m] == [e["cursor"] for e in events]
    # the stream ends by itself (SKIPLOCK_API_MAX_WAIT_SECONDS), its last id the place to resume
    assert stream.ended.wait(10)
    assert stream.comments[-1] == "the stream ends here; reconnect with Last-Event-ID"
    resume_at = stream.last_id()
    assert resume_at != events[-1]["cursor"]  # moved past the filtered-out event too

    # committed while no one was connected: given on reconnecting with Last-Event-ID
    missed = skiplock.enqueue(db_url, "mail.send", {}, queue="mail")
    again = StreamReader(client, headers={"Last-Event-ID": resume_at}, queue="mail")
    wait_for(lambda: again.events(), 10, message="the missed event")
    assert [e["task_id"] for e in again.events()] == [str(missed)]
    again.close()
    # from the first event's id: the second one and the missed one (Last-Event-ID wins over after)
    replay = StreamReader(client, headers={"Last-Event-ID": events[0]["cursor"]}, after="0", queue="mail")
    wait_for(lambda: len(replay.events()) == 2, 10, message="the replay")
    assert [e["task_id"] for e in replay.events()] == [str(first[1]), str(missed)]
    replay.close()
    bad = StreamReader(client, headers={"Last-Event-ID": "nope"})
    assert bad.response.status_code == 400 and bad.response.json()["error"]["message"].startswith("Last-Event-ID")


def test_a_quiet_stream_keeps_alive_and_ends_by_itself(serve):
    client = serve(SKIPLOCK_API_MAX_WAIT_SECONDS="6")
    started = time.monotonic()
    stream = StreamReader(client)
    assert stream.ended.wait(15)
    elapsed = time.monotonic() - started
    assert stream.messages[0]["retry"] == "500" and stream.messages[0]["id"]
    assert stream.comments == ["keep-alive", "the stream ends here; reconnect with Last-Event-ID"]
    assert stream.events() == [] and 5.5 < elapsed < 10, elapsed


def test_the_feed_and_its_stream_need_a_reader_token(serve):
    client = serve()
    for path in ("/v1/events", "/v1/events/stream"):
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer not-a-token"}):
            r = client.get(path, headers=headers)
            assert (r.status_code, r.json()["error"]["code"]) == (401, "auth.unauthorized"), (path, r.text)
            assert r.text.count("\n") == 1
    assert client.get("/v1/events").status_code == 200


def test_past_the_bound_a_feed_answers_429_and_other_requests_still_answer(serve, db_url):
    client = serve(threads=4, SKIPLOCK_API_MAX_FEEDS="2", SKIPLOCK_API_MAX_WAIT_SECONDS="20")
    task_id = skiplock.enqueue(db_url, "mail.send", {})
    held = [StreamReader(client) for _ in range(2)]
    assert [s.response.status_code for s in held] == [200, 200]
    for refused in (client.get("/v1/events/stream"), client.get("/v1/events", params={"wait": 5})):
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "5"
        error = refused.json()["error"]
        assert error["code"] == "request.rate_limited" and "SKIPLOCK_API_MAX_FEEDS=2" in error["message"]
        assert refused.text.count("\n") == 1
    # a feed read without wait, and any other request, still answer: a thread is left for them
    assert feed(client)["events"] == []
    assert client.get(f"/v1/tasks/{task_id}").json()["state"] == "queued"
    # a client that leaves frees its room: seen at the stream's next read, not its next keep-alive
    held[0].close()
    left = time.monotonic()
    again = wait_for(lambda: _stream_if_room(client), 5, interval=0.1, message="room for a stream again")
    print(f"room again {time.monotonic() - left:.2f} s after the client left")
    again.close()
    held[1].close()


def _stream_if_room(client: httpx.Client) -> StreamReader | None:
    stream = StreamReader(client)
    if stream.response.status_code == 200:
        return stream
    assert stream.response.status_code == 429
    return None


def test_feeds_and_long_polls_leave_a_thread_to_the_other_requests(serve, db_url):
    client = serve(threads=3, SKIPLOCK_API_MAX_FEEDS="2", SKIPLOCK_API_MAX_WAITS="2")
    task_id = skiplock.enqueue(db_url, "mail.send", {})
    held = [StreamReader(client) for _ in range(2)]
    assert [s.response.status_code for s in held] == [200, 200]
    # both feeds hold 2 of the 3 threads: a long-poll of a task is refused, not queued behind them
    refused = client.get(f"/v1/tasks/{task_id}", params={"wait": 5})
    assert refused.status_code == 429 and "hold every request thread of this worker but one" in refused.text
    started = time.monotonic()
    assert client.get("/v1/tasks").status_code == 200 and client.get("/v1/queues").status_code == 200
    assert time.monotonic() - started < 5
    for stream in held:
        stream.close()


def test_the_console_follows_the_stream_with_its_session(serve, db_url):
    client = serve(SKIPLOCK_API_MAX_WAIT_SECONDS="3")
    console = httpx.Client(base_url=str(client.base_url), timeout=15)
    # without a session: the login page, no stream
    r = console.get("/ui/events/stream")
    assert (r.status_code, r.headers["Location"]) == (302, "/ui/login")
    sign_in(console, "reader")
    task_id = skiplock.enqueue(db_url, "mail.send", {})
    stream = StreamReader(console, "/ui/events/stream", task=str(task_id), after="0")
    assert stream.response.status_code == 200
    assert stream.response.headers["content-type"].startswith("text/event-stream")
    assert stream.response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    wait_for(lambda: stream.events(), 10, message="the task's event")
    assert [(e["task_id"], e["type"]) for e in stream.events()] == [(str(task_id), "queued")]
    stream.close()
    bad = console.get("/ui/events/stream", params={"queue": "bad name!"})
    assert bad.status_code == 400
    console.close()

"""The task event feed: `GET /v1/events?after=CURSOR` (a page, or a long-poll with `wait`) and
`GET /v1/events/stream` (Server-Sent Events, resumed with `Last-Event-ID`), filtered by queue,
kind and task. The pull twin of the webhooks: a program follows the work as the console does.

The order and the cursor are the store's (engine/store/events.py, engine/sql/events.sql): an
event is given once every transaction older than its own has ended, so a cursor never passes an
event that commits later, and a rolled-back transaction's events never appear.

Waiting is polling, on the pool, every FEED_POLL_SECONDS: no statement of the hot path notifies
anyone of an event (a NOTIFY per transition would serialise every commit on the notify queue's
lock). A feed holds a request thread of gunicorn's gthread worker for as long as it lasts, so its
time is bounded (SKIPLOCK_API_MAX_WAIT_SECONDS, below the shutdown grace) and so is the number a
worker holds at once (SKIPLOCK_API_MAX_FEEDS; admission_bounds.py keeps one thread for the other
requests). A stream that ends is reconnected by its client with Last-Event-ID: nothing is lost.
It must not hold a pooled connection between its reads, nor touch the request after its view
returned (the stream runs after it).
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable, Iterator

from flask import Blueprint, Response, g, request

from ..engine.errors import InvalidInput, SkiplockError, TooManyRequests
from ..engine.store import FeedCursor, FeedEvent, FeedPage, Store
from ..engine.store.events import CURSOR_PATTERN
from .app_state import api
from .operations import operation
from .render import EVENT, event_json
from .responses import json_response
from .schema import Array, Integer, Name, Number, Object, String, Uuid
from .tasks import WAIT_QUERY_MAX  # the wait itself is cut to SKIPLOCK_API_MAX_WAIT_SECONDS

bp = Blueprint("events", __name__)

# how often a waiting feed reads again: an event reaches a follower within about this much
FEED_POLL_SECONDS = 0.2
# a stream with nothing to send says so this often (proxies close connections that stay silent)
KEEPALIVE_SECONDS = 5.0
# what a stream asks its client to wait before reconnecting (the SSE `retry:` field)
RECONNECT_MILLISECONDS = 500


class Cursor(String):
    """A feed cursor as text (engine/store/events.FeedCursor)."""

    def __init__(self, description: str):
        super().__init__(description, max_length=80, pattern=CURSOR_PATTERN)

    def pattern_help(self) -> str:
        return "not a feed cursor (use the `cursor` of an answer, or the `id` of an event)"


CURSOR = Cursor("A feed cursor: the `cursor` of an answer or the `id` of an event; `0`: from the oldest event "
                "the feed holds. Absent: from now.")
FILTERS = {"queue": Name("Only the events of this queue's tasks."), "kind": Name("Only the events of this kind's tasks."),
           "task": Uuid("Only this task's events.")}
FEED_QUERY = {"after": CURSOR, **FILTERS, "limit": Integer(minimum=1, maximum=1000, default=100),
              "wait": Number("Long-poll: with no event to give, hold the request until one commits, for at most "
                             "this many seconds (cut to SKIPLOCK_API_MAX_WAIT_SECONDS).", minimum=0,
                             maximum=WAIT_QUERY_MAX)}
STREAM_QUERY = {"after": CURSOR, **FILTERS}
LAST_EVENT_ID = Cursor("The `id` of the last event received (EventSource sends it when it reconnects); it wins "
                       "over `after`.")

FEED_EVENT = Object({
    "cursor": String("This event's place in the feed: `after` resumes after it."),
    "task_id": Uuid(), "queue": Name(), "kind": Name(), **EVENT.fields,
}, required=("cursor", "task_id", "queue", "kind", "seq", "type", "at"))
FEED_PAGE = Object({"events": Array(FEED_EVENT),
                    "cursor": String("Where the next read starts: pass it as `after`. It moves past the events "
                                     "the filters leave out.")}, required=("events", "cursor"))

FEED_ERRORS = (InvalidInput, TooManyRequests)


def feed_event_json(fed: FeedEvent) -> dict:
    return {"cursor": fed.cursor.text(), "task_id": str(fed.event.task_id), "queue": fed.queue, "kind": fed.kind,
            **event_json(fed.event)}


class Follower:
    """One reader of the feed from a cursor with its filters; `read()` gives the next events and
    moves the cursor past them."""

    def __init__(self, store: Store, after: FeedCursor | None, query: dict, limit: int = 100):
        self.store, self.limit = store, limit
        self.filters = dict(queue=query["queue"], kind=query["kind"], task_id=query["task"])
        self.cursor = after if after is not None else store.events.event_feed_read(None).cursor

    def read(self) -> FeedPage:
        page = self.store.events.event_feed_read(self.cursor, **self.filters, limit=self.limit)
        self.cursor = page.cursor
        return page

    def wait(self, seconds: float) -> list[FeedEvent]:
        """The next events, waiting up to `seconds` for one to commit."""
        deadline = time.monotonic() + seconds
        while True:
            events = self.read().events
            left = deadline - time.monotonic()
            if events or left <= 0:
                return events
            time.sleep(min(FEED_POLL_SECONDS, left))


def _after(query: dict, header: str | None = None) -> FeedCursor | None:
    if header is not None:
        return FeedCursor.parse(header, "Last-Event-ID")
    return None if query["after"] is None else FeedCursor.parse(query["after"])


@operation(bp, "GET", "/v1/events", summary="Task events after a cursor (long-poll with wait)", role="reader",
           tag="events", query=FEED_QUERY,
           description="Every task's events in one order that resumes: pass the answer's `cursor` as `after` "
                       "to read on. An event is given once every database transaction that began writing before "
                       "its own has ended, so no event is ever passed over, and a rolled-back one never appears "
                       "(a long write transaction delays the feed). With `wait` and no event to give, the request "
                       "is held until one commits; beyond SKIPLOCK_API_MAX_FEEDS feeds at once on one gunicorn "
                       "worker, 429 request.rate_limited with Retry-After. Read on the primary.",
           responses={200: ("The events, oldest first, and the next read's cursor.", FEED_PAGE)}, errors=FEED_ERRORS)
def read_events():
    query, bounds = g.query, api().admission_bounds
    follower = Follower(api().store, _after(query), query, query["limit"])
    events = follower.read().events
    seconds = bounds.hold_seconds(query["wait"]) if bounds.max_feeds else 0.0
    if not events and seconds:
        release = bounds.feed()
        try:
            events = follower.wait(seconds)
        finally:
            release()
    return json_response({"events": [feed_event_json(e) for e in events], "cursor": follower.cursor.text()})


@operation(bp, "GET", "/v1/events/stream", summary="Task events as Server-Sent Events", role="reader",
           tag="events", query=STREAM_QUERY, headers={"Last-Event-ID": LAST_EVENT_ID},
           content_type="text/event-stream",
           description="`text/event-stream`: each event's `id:` is its cursor and its `data:` the event as "
                       "`GET /v1/events` gives it. A comment line keeps a quiet stream open every "
                       f"{KEEPALIVE_SECONDS:g} s, and an `id:` line without data moves the client's "
                       "Last-Event-ID past events the filters leave out. The stream ends after "
                       "SKIPLOCK_API_MAX_WAIT_SECONDS (so that no request thread is held for ever); the client "
                       "reconnects with the Last-Event-ID header, as EventSource does by itself, and misses "
                       "nothing. Beyond SKIPLOCK_API_MAX_FEEDS feeds at once on one gunicorn worker, or with "
                       "SKIPLOCK_API_MAX_WAIT_SECONDS=0, 429 request.rate_limited with Retry-After.",
           responses={200: ("The stream, until it ends.", String("`id:` and `data:` lines, and `:` comments."))},
           errors=FEED_ERRORS)
def stream_events():
    query, ctx = g.query, api()
    after = _after(query, g.headers["Last-Event-ID"])
    seconds = ctx.admission_bounds.hold_seconds(ctx.settings.api_max_wait_seconds)
    if not seconds:
        raise TooManyRequests("this API serves no event stream (SKIPLOCK_API_MAX_WAIT_SECONDS=0); read GET "
                              "/v1/events instead", retry_after=60)
    release = ctx.admission_bounds.feed()
    try:
        follower = Follower(ctx.store, after, query)
    except BaseException:
        release()
        raise
    # the server's socket, where it says which (gunicorn, werkzeug): a client that left is seen at the
    # next read, not at the next write, which may be a keep-alive away, its thread and room held till then
    client = request.environ.get("gunicorn.socket") or request.environ.get("werkzeug.socket")
    response = Response(_stream(follower, seconds, client), mimetype="text/event-stream",
                        headers={"X-Accel-Buffering": "no"})  # a proxy that buffers would hold events back
    response.call_on_close(release)  # the server calls it once the stream ended, however it ended
    return response


def _gone(client: socket.socket | None) -> bool:
    """Whether the client closed its connection (its end of file is readable; a request it sent
    meanwhile is data, not the end)."""
    if client is None:
        return False
    try:
        poll = select.poll()  # not select(): no bound on the descriptor's number
        poll.register(client, select.POLLIN)
        return bool(poll.poll(0)) and client.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or closed under us
        return True


def _stream(follower: Follower, seconds: float, client: socket.socket | None = None,
            clock: Callable[[], float] = time.monotonic) -> Iterator[str]:
    deadline = clock() + seconds
    sent = follower.cursor
    yield f"retry: {RECONNECT_MILLISECONDS}\nid: {sent.text()}\n\n"
    quiet_since = clock()
    try:
        while True:
            page = follower.read()
            for event in page.events:
                yield f"id: {event.cursor.text()}\ndata: {json.dumps(feed_event_json(event), separators=(',', ':'))}\n\n"
            if page.events:
                sent, quiet_since = page.events[-1].cursor, clock()
            now = clock()
            if now >= deadline:
                break
            if _gone(client):
                return
            if now - quiet_since >= KEEPALIVE_SECONDS:
                moved = f"id: {follower.cursor.text()}\n" if follower.cursor != sent else ""
                sent, quiet_since = follower.cursor, now
                yield f": keep-alive\n{moved}\n"
            if len(page.events) < follower.limit:  # caught up: wait for more
                time.sleep(min(FEED_POLL_SECONDS, deadline - now))
    except SkiplockError as exc:  # the status is sent: say why in a comment, and end; the client reconnects
        yield f": {exc.code}\n\n"
        return
    yield f": the stream ends here; reconnect with Last-Event-ID\nid: {follower.cursor.text()}\n\n"

"""Admission bounds of the API, per gunicorn worker process: a token's submission rate (a token
bucket per token name) and concurrency, the room for large request bodies (bodies whose
parsing costs several times their size in memory), the long-polls held at once (each holds a
request thread and a database connection) and the event feeds held at once (long-polls and streams
of GET /v1/events, each a request thread). A full bound answers 429 with Retry-After, before the
body is read or the wait begins.

gunicorn's gthread worker runs a request on one of its `--threads` threads from its first byte to
its last, a stream included: long-polls and feeds together may hold all of them but one, so that
the other requests always have a thread (when the app knows its thread count: `request_threads`).

State lives in this process only. Sharing it across workers would need a lock or counters that a
worker killed mid-request could leave held, or a database round trip per submission; the pod's
effective bound is the per-worker value times its workers (docs/OPERATIONS.md).

(Bounds, not limits: a limit is a task limit of one kind, engine/limits.py.)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from ..engine.errors import TooManyRequests
from ..engine.settings import ApiSettings


class _Bucket:
    __slots__ = ("tokens", "stamp", "running")

    def __init__(self, tokens: float, stamp: float):
        self.tokens, self.stamp, self.running = tokens, stamp, 0


class AdmissionBounds:
    """Owns every counter; request threads call `admit()` and `large_body()` and call the
    release they got back when the request ends."""

    def __init__(self, settings: ApiSettings, clock: Callable[[], float] = time.monotonic,
                 request_threads: int | None = None):
        self.rate = settings.api_submit_rate
        self.burst = max(1.0, float(settings.api_submit_burst))
        self.concurrency = settings.api_submit_concurrency
        self.large_body_bytes = settings.api_large_body_bytes
        self.large = threading.BoundedSemaphore(settings.api_large_bodies)
        self.max_waits = settings.api_max_waits
        self.waits = threading.BoundedSemaphore(max(1, settings.api_max_waits))
        self.max_feeds = settings.api_max_feeds
        self.feeds = threading.BoundedSemaphore(max(1, settings.api_max_feeds))
        self.max_wait_seconds = settings.api_max_wait_seconds
        # whole seconds below the shutdown grace: a hold in flight at SIGTERM ends, answered, first
        self.grace_seconds = int(settings.shutdown_grace_seconds) - 1
        # long-polls and feeds held together: at most the worker's threads but one (None: unbounded)
        self.max_holds = None if request_threads is None else max(0, request_threads - 1)
        self._holds = 0
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}  # one per configured token name: bounded by the config

    def admit(self, token: str) -> Callable[[], None]:
        """Count one submission of `token` or raise TooManyRequests; returns its release."""
        if not self.rate and not self.concurrency:
            return _nothing
        with self._lock:
            now = self.clock()
            bucket = self._buckets.get(token)
            if bucket is None:
                bucket = self._buckets[token] = _Bucket(self.burst, now)
            if self.concurrency and bucket.running >= self.concurrency:
                raise TooManyRequests(f"token {token!r} has {bucket.running} submissions in flight on this "
                                      f"worker (SKIPLOCK_API_SUBMIT_CONCURRENCY={self.concurrency})")
            if self.rate:
                bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
                bucket.stamp = now
                if bucket.tokens < 1:
                    wait = math.ceil((1 - bucket.tokens) / self.rate)
                    raise TooManyRequests(f"token {token!r} is over SKIPLOCK_API_SUBMIT_RATE={self.rate:g} "
                                          f"submissions per second (burst {self.burst:g}) on this worker", wait)
                bucket.tokens -= 1
            bucket.running += 1

        def release() -> None:
            with self._lock:
                bucket.running -= 1

        return release

    def is_large(self, content_length: int | None, max_bytes: int) -> bool:
        """A body that may exceed the large-body size: by its Content-Length, or by the route's
        largest body (`max_bytes`) when it has none (chunked)."""
        if content_length is not None and content_length > max_bytes:
            return False  # refused 413 before it is read
        return (content_length if content_length is not None else max_bytes) > self.large_body_bytes

    def large_body(self) -> Callable[[], None]:
        """Take room for one large body or raise TooManyRequests; returns its release."""
        if not self.large.acquire(blocking=False):
            raise TooManyRequests("this worker is parsing as many large bodies as it may "
                                  "(SKIPLOCK_API_LARGE_BODIES); retry", retry_after=1)
        return self.large.release


    def long_poll(self) -> Callable[[], None]:
        """Take room for one long-poll (GET /v1/tasks/{id}?wait=) or raise TooManyRequests;
        returns its release."""
        if not self.max_waits or not self.waits.acquire(blocking=False):
            raise TooManyRequests(f"this worker holds as many long-polls as it may (SKIPLOCK_API_MAX_WAITS="
                                  f"{self.max_waits}); retry, or read the task without wait", retry_after=1)
        return self._hold(self.waits, "retry, or read the task without wait")

    def feed(self) -> Callable[[], None]:
        """Take room for one event feed (a GET /v1/events long-poll or stream) or raise
        TooManyRequests; returns its release."""
        if not self.max_feeds or not self.feeds.acquire(blocking=False):
            raise TooManyRequests(f"this worker holds as many event feeds as it may (SKIPLOCK_API_MAX_FEEDS="
                                  f"{self.max_feeds}); retry, or read GET /v1/events without wait",
                                  retry_after=FEED_RETRY_SECONDS)
        return self._hold(self.feeds, "retry, or read GET /v1/events without wait")

    def hold_seconds(self, asked: float | None) -> float:
        """How long a long-poll or a feed may hold its request: what it asked, cut to
        SKIPLOCK_API_MAX_WAIT_SECONDS and below the shutdown grace. 0: not at all."""
        return max(0.0, min(asked or 0.0, self.max_wait_seconds, self.grace_seconds))

    def _hold(self, room: threading.BoundedSemaphore, hint: str) -> Callable[[], None]:
        """Count one more request thread held, `room` already taken; its release frees both."""
        with self._lock:
            if self.max_holds is not None and self._holds >= self.max_holds:
                room.release()
                raise TooManyRequests(f"long-polls and event feeds hold every request thread of this worker but "
                                      f"one ({self.max_holds}); {hint}", retry_after=1)
            self._holds += 1

        def release() -> None:
            with self._lock:
                self._holds -= 1
            room.release()

        return release


# past the feed bound: the console's fallback reads pages meanwhile; EventSource does not retry a 429
FEED_RETRY_SECONDS = 5


def _nothing() -> None:
    pass

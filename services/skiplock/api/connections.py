"""The API's gunicorn worker: gthread, with a deadline on reading each request. A client gets
SKIPLOCK_API_HEADER_TIMEOUT_SECONDS to send its request line and headers (then the connection is
closed) and SKIPLOCK_API_BODY_TIMEOUT_SECONDS for its body (then 408 `request.timeout`), so a
slow client holds a request thread for a bounded time, not for as long as it keeps the
connection open. The deadline is the request's total, not a per-read timeout that a byte every
few seconds would renew. Connections per worker are capped by gunicorn's worker_connections
(SKIPLOCK_API_MAX_CONNECTIONS).

It must not answer probes: /healthz and /readyz for Kubernetes are the master's (probes.py), on a
listener no client of this one can hold.
"""

from __future__ import annotations

import errno
import time

from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import TConn

from ..engine.errors import RequestTimedOut
from .gunicorn_classes import JsonErrorThreadWorker

# after a response: the time gthread gives itself to drain an unread body (its own bound)
_DRAIN_SECONDS = 5.0


class _DeadlineSocket:
    """The socket as gunicorn's request parser reads it: each recv() waits at most until the
    connection's current deadline. Writes keep a timeout too (the body's), so a client that
    never reads its response cannot hold the thread either."""

    def __init__(self, conn: "_Conn"):
        self._conn = conn

    def __getattr__(self, name):
        return getattr(self._conn.sock, name)

    def recv(self, size: int) -> bytes:
        conn = self._conn
        left = conn.deadline - time.monotonic()
        if left <= 0:
            conn.expired()
        sock = conn.sock
        sock.settimeout(left)
        try:
            return sock.recv(size)
        except TimeoutError:
            conn.expired()
        finally:
            sock.settimeout(conn.write_timeout)


class _Conn(TConn):
    deadline = float("inf")
    phase = "header"  # header: closed quietly; body: 408; drain: closed quietly
    write_timeout: float | None = None
    timed_out = False

    def init(self) -> None:
        fresh = self.parser is None
        super().init()
        if fresh and not self.is_http2 and hasattr(self.parser, "unreader"):
            self.parser.unreader.sock = _DeadlineSocket(self)

    def start(self, phase: str, seconds: float) -> None:
        self.phase, self.deadline = phase, time.monotonic() + seconds

    def close(self, graceful: bool = False) -> None:
        # gthread's graceful close lingers on the main thread until the peer closes (up to 2 s):
        # a client that ran out of time would get that from every connection it holds
        super().close(graceful and not self.timed_out)

    def expired(self):
        self.timed_out = True
        if self.phase == "body":
            raise RequestTimedOut("request body not received in time (SKIPLOCK_API_BODY_TIMEOUT_SECONDS)")
        raise NoMoreData()  # gthread closes the connection and logs it at debug level only


class ApiWorker(JsonErrorThreadWorker):
    """gthread (its refusals in the API's JSON shape) with read deadlines per request."""

    def accept(self, listener) -> None:
        # as gthread's accept(), with our connection type
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        client_sock.setblocking(True)
        conn = _Conn(self.cfg, client_sock, client_addr, listener.getsockname())
        conn.write_timeout = self.app.settings.api_body_timeout_seconds
        # from the connection, not from when a thread takes it: queued ones run out of time too
        conn.start("header", self.app.settings.api_header_timeout_seconds)
        self.enqueue_req(conn)

    def handle(self, conn):
        if conn.phase != "header":  # a kept-alive connection's next request
            conn.start("header", self.app.settings.api_header_timeout_seconds)
        return super().handle(conn)

    def handle_request(self, req, conn):
        # the request line and headers are in: the body's own deadline starts now
        conn.start("body", self.app.settings.api_body_timeout_seconds)
        try:
            return super().handle_request(req, conn)
        finally:
            conn.start("drain", _DRAIN_SECONDS)

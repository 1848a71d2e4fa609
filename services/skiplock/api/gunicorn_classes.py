"""gunicorn's classes as the API needs them: a logger whose lines go through skiplock's own
logging (one format, secrets scrubbed: gunicorn quotes refused request lines, query strings and
all), and a worker whose own refusals (a request line too long: 414, header fields too large
or too many: 431, malformed requests: 400) answer in the API's JSON error shape instead of
gunicorn's HTML page.

gunicorn offers no hook for its refusals; they are written by `Worker.handle_error`, so the
worker class is where they can be reshaped. The status and reason stay gunicorn's.
"""

from __future__ import annotations

import json
import re

from gunicorn.glogging import Logger
from gunicorn.workers.gthread import ThreadWorker


class ApiLogger(Logger):
    """gunicorn's error log without gunicorn's handler: its records propagate to the root logger
    that engine/logs.setup() configured (the access log stays off)."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            self.error_log.removeHandler(handler)
        self.error_log.propagate = True


def json_error(status: int, reason: str) -> bytes:
    """A complete HTTP/1.1 response: {"error": {"code", "message"}} with gunicorn's status."""
    code = "request." + (re.sub(r"[^a-z]+", "_", reason.lower()).strip("_").removeprefix("request_") or "invalid")
    body = json.dumps({"error": {"code": code, "message": reason}}, separators=(",", ":")).encode() + b"\n"
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class _JsonReply:
    """The client's socket as handle_error sees it: the one error page gunicorn writes leaves as
    json_error() of its status line. Everything else goes to the socket."""

    def __init__(self, sock):
        self._sock = sock

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def sendall(self, data: bytes) -> None:
        status_line = data.split(b"\r\n", 1)[0].decode("latin-1")
        _, status, reason = (status_line.split(" ", 2) + ["", ""])[:3]
        self._sock.sendall(json_error(int(status), reason) if status.isdigit() else data)


class JsonErrorThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, its refusals in the API's error shape."""

    def handle_error(self, req, client, addr, exc) -> None:
        super().handle_error(req, _JsonReply(client), addr, exc)

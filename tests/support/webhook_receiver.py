"""A webhook receiver's handler for pytest-httpserver (the `receiver` fixture of tests/conftest.py):
records the webhook-id of every request it starts and finishes, after `delay` seconds, so a test
counts deliveries and their duplicates by webhook-id."""

from __future__ import annotations

import threading
import time

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from skiplock.engine.webhooks import generate_secret


class Receiver:
    """Records the webhook-id of every request it starts and finishes, after `delay` seconds."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.started: list[str] = []
        self.received: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Response:
        webhook_id = request.headers["webhook-id"]
        with self.lock:
            self.started.append(webhook_id)
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            self.received.append(webhook_id)
        return Response("", status=200)

    def count(self) -> int:
        with self.lock:
            return len(self.received)


def subscribe(store, server: HTTPServer, receiver: Receiver, events=("task.completed",)):
    """An endpoint on `server` whose requests `receiver` answers, subscribed to `events`."""
    server.expect_request("/hook", method="POST").respond_with_handler(receiver)
    return store.webhooks.webhook_endpoint_insert(f"http://127.0.0.1:{server.port}/hook", list(events),
                                                  generate_secret())

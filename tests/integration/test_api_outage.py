"""The API while Postgres cannot be reached: alive, not ready, and it says so quickly."""

from __future__ import annotations

import time

from skiplock.api.app import create_app
from skiplock.engine.settings import Settings
from tests.support.harness import free_port


def test_readyz_answers_503_within_the_probe_budget_and_healthz_stays_200():
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/gone"  # nothing listens there
    client = create_app(Settings.from_env({"SKIPLOCK_DATABASE_URL": url, "SKIPLOCK_API_AUTH": "disabled"})).test_client()
    started = time.monotonic()
    ready = client.get("/readyz")
    took = time.monotonic() - started
    assert ready.status_code == 503
    assert ready.get_json()["error"]["code"] == "database.unavailable"
    assert took < 5, f"/readyz took {took:.1f}s: a readiness probe would time out before it answers"
    assert client.get("/healthz").status_code == 200

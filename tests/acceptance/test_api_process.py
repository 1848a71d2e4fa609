"""`skiplock api` as an operator runs it: gunicorn with two workers on a real port, driven with
httpx. Submits (20 at once with one Idempotency-Key, spread over the worker processes), reads, the
metrics summed over the workers, SIGTERM → exit 0; and refusing to start without tokens."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

import skiplock

from tests.integration.test_api import CONSOLE_SESSION_KEY, TOKEN_CONFIG, TOKENS
from tests.integration.test_console import csrf_of
from tests.support.harness import free_port, wait_exit, wait_for

ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}


def start_api(processes, db_url, port, **env):
    return processes.spawn(db_url, "--bind", f"127.0.0.1:{port}", "--workers", "2", command="api",
                           env={"SKIPLOCK_API_TOKENS": TOKEN_CONFIG, "SKIPLOCK_LOG_FORMAT": "text",
                                "SKIPLOCK_CONSOLE_SESSION_KEY": CONSOLE_SESSION_KEY, **env})


def wait_ready(proc, base: str) -> None:
    def ready():
        if not proc.alive():
            raise AssertionError(f"skiplock api exited early ({proc.popen.returncode}):\n{proc.log()[-3000:]}")
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 30, message="skiplock api ready")


def test_api_under_gunicorn(processes, db_url, db):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_api(processes, db_url, port)
    wait_ready(proc, base)

    with httpx.Client(base_url=base, headers=ADMIN, timeout=30) as client:
        created = client.post("/v1/tasks", json={"kind": "reports.daily", "payload": {"day": "2030-01-01"}})
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        read = client.get(f"/v1/tasks/{task_id}")
        assert read.json()["payload"] == {"day": "2030-01-01"}
        # answers that hold task data: never sniffed as another type, never cached (issue 35)
        for answer in (created, read, httpx.get(f"{base}/v1/tasks", timeout=5)):
            assert answer.headers["X-Content-Type-Options"] == "nosniff", answer.headers
            assert answer.headers["Cache-Control"] == "no-store", answer.headers
        assert client.post("/v1/tasks:batch", json={"tasks": [{"kind": "bulk"}] * 200}).json()["created"] == 200
        assert httpx.get(f"{base}/v1/tasks", timeout=5).status_code == 401
        assert client.get("/nope").json()["error"]["code"] == "request.not_found"

    barrier = threading.Barrier(20)
    results: list[tuple[int, str]] = []

    def submit():
        barrier.wait()
        r = httpx.post(f"{base}/v1/tasks", json={"kind": "once", "payload": {"n": 1}},
                       headers={**ADMIN, "Idempotency-Key": "acceptance"}, timeout=30)
        results.append((r.status_code, r.json().get("id")))

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(status for status, _ in results) == [200] * 19 + [201]
    assert len({task_id for _, task_id in results}) == 1
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE kind = 'once'").fetchone()[0] == 1

    # whichever of the two workers served a request, /metrics adds up every worker's samples
    metrics = httpx.get(f"{base}/metrics", timeout=5).text
    submits = [line for line in metrics.splitlines()
               if line.startswith('skiplock_api_requests_total{method="POST",route="/v1/tasks",')]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in submits) == 21, submits

    proc.signal(signal.SIGTERM)
    code, _ = wait_exit(proc, 30)
    assert code == 0, proc.log()[-3000:]


@pytest.mark.parametrize("env, fragment", [
    ({"SKIPLOCK_API_TOKENS": ""}, "SKIPLOCK_API_TOKENS: no API token configured"),
    ({"SKIPLOCK_API_TOKENS": "ci:root:abc"}, "SKIPLOCK_API_TOKENS: entry 1 (ci): role 'root'"),
])
def test_api_refuses_to_start_without_valid_tokens(processes, db_url, env, fragment):
    proc = start_api(processes, db_url, free_port(), **env)
    code, _ = wait_exit(proc, 30)
    lines = proc.log().strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"skiplock api: {fragment}"), lines


def test_without_auth_the_console_needs_no_key(processes, db_url, db):
    """SKIPLOCK_API_AUTH=disabled and no SKIPLOCK_CONSOLE_SESSION_KEY: the run makes a key of its
    own before the workers fork, so every worker honours the forms' CSRF token (a session there
    names nobody: everyone is admin)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_api(processes, db_url, port, SKIPLOCK_API_AUTH="disabled", SKIPLOCK_API_TOKENS="",
                     SKIPLOCK_CONSOLE_SESSION_KEY="")
    wait_ready(proc, base)
    skiplock.enqueue(db_url, "k", {}, queue="mail")  # a queue, so the overview has its Pause form
    page = httpx.get(f"{base}/ui/", timeout=10)
    assert page.status_code == 200 and "No authentication" in page.text
    csrf = csrf_of(page.text)
    # a connection each, so that both workers get some; each must accept the cookie the first made
    answers = [httpx.post(f"{base}/ui/queues/q{i}/pause", data={"csrf": csrf}, cookies=page.cookies,
                          timeout=10).status_code for i in range(12)]
    assert answers == [303] * 12
    assert db.execute("SELECT count(*) FROM skiplock.pauses WHERE scope = 'queue'").fetchone()[0] == 12

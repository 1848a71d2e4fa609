"""Wrong tokens are throttled per client address (issue 35): past SKIPLOCK_API_MAX_AUTH_FAILURES
in a minute, counted across the API's two gunicorn workers, a wrong token answers 429
`auth.throttled` with `Retry-After`, the address is refused meanwhile (its right token too), and
the block is audited once and counted per refusal; another address's right token is served, and a
request with no token is a 401 as before. Before, 50 wrong tokens in 2.7 s were 50 401s. The second
address is a trusted proxy's X-Forwarded-For (SKIPLOCK_API_TRUSTED_PROXIES), as behind an ingress."""

from __future__ import annotations

import signal

import httpx

from tests.acceptance.test_api_process import start_api, wait_ready
from tests.integration.test_api import TOKENS
from tests.integration.test_console import csrf_of
from tests.support.harness import free_port, sample, samples_of, wait_exit

BOUND = 5


def test_wrong_tokens_past_the_bound_are_refused_429_across_workers(processes, db_url, db):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_api(processes, db_url, port, SKIPLOCK_API_MAX_AUTH_FAILURES=str(BOUND),
                     SKIPLOCK_API_TRUSTED_PROXIES="127.0.0.1/32")
    wait_ready(proc, base)
    attacker = {"X-Forwarded-For": "203.0.113.7"}
    other = {"X-Forwarded-For": "198.51.100.9"}

    # a connection each, spread over both workers
    wrong = [httpx.get(f"{base}/v1/tasks", headers={**attacker, "Authorization": f"Bearer guess-{i}"}, timeout=10)
             for i in range(20)]
    statuses = [r.status_code for r in wrong]
    assert statuses == [401] * BOUND + [429] * (20 - BOUND), statuses
    assert all(r.json()["error"]["code"] == "auth.throttled" for r in wrong[BOUND:])
    assert all(1 <= int(r.headers["Retry-After"]) <= 60 for r in wrong[BOUND:])

    # the blocked address: its right token is refused too, on a worker that saw its wrong tokens
    right = [httpx.get(f"{base}/v1/tasks", headers={**attacker, **bearer("admin")}, timeout=10) for _ in range(4)]
    assert 429 in [r.status_code for r in right], [r.status_code for r in right]
    # another address: served; no token: 401, not a guess
    assert [httpx.get(f"{base}/v1/tasks", headers={**other, **bearer("reader")}, timeout=10).status_code
            for _ in range(4)] == [200] * 4
    assert [httpx.get(f"{base}/v1/tasks", headers=other, timeout=10).status_code for _ in range(12)] == [401] * 12

    # the console's sign-in counts on the same address
    login = httpx.get(f"{base}/ui/login", headers=attacker, timeout=10)
    signin = httpx.post(f"{base}/ui/login", headers=attacker, cookies=login.cookies, timeout=10,
                        data={"token": "another guess", "csrf": csrf_of(login.text)})
    assert signin.status_code == 429 and 1 <= int(signin.headers["Retry-After"]) <= 60

    rows = db.execute("SELECT actor, target, outcome FROM skiplock.audit_log WHERE action = 'auth.throttled'").fetchall()
    assert rows == [("anonymous", "203.0.113.7", "auth.throttled")]
    assert db.execute("SELECT failures FROM skiplock.auth_failures WHERE client = '198.51.100.9'").fetchall() == []
    samples = samples_of(httpx.get(f"{base}/metrics", timeout=5).text)  # summed over the workers
    refused = sum(sample(samples, "skiplock_api_auth_throttled_total", surface=s) or 0 for s in ("api", "console"))
    assert refused == (20 - BOUND) + sum(r.status_code == 429 for r in right) + 1, refused
    proc.signal(signal.SIGTERM)
    assert wait_exit(proc, 30)[0] == 0


def bearer(role: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[role]}"}

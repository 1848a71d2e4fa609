"""Sign-out ends a console session on the server (issue 35): a copy of the cookie kept after
`POST /ui/logout` gets the sign-in page and can change nothing, and `skiplock tokens sign-out NAME`
ends every session of one token, on every API worker, leaving other tokens' sessions alone. Before,
the session was a signed cookie only: the kept copy read pages and paused a queue as admin for 8
hours. Against `skiplock api` under gunicorn (two workers), with httpx and the real CLI."""

from __future__ import annotations

import signal

import httpx

import skiplock
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.acceptance.test_cli import skiplock as skiplock_cli
from tests.integration.test_api import TOKENS
from tests.integration.test_console import csrf_of
from tests.support.harness import free_port, wait_exit


def sign_in(base: str, token: str) -> httpx.Cookies:
    login = httpx.get(f"{base}/ui/login", timeout=10)
    answer = httpx.post(f"{base}/ui/login", data={"token": token, "csrf": csrf_of(login.text)},
                        cookies=login.cookies, timeout=10)
    assert answer.status_code == 303, answer.text[:500]
    return answer.cookies


def page(base: str, cookies: httpx.Cookies) -> httpx.Response:
    return httpx.get(f"{base}/ui/", cookies=cookies, timeout=10)


def paused(db) -> int:
    return db.execute("SELECT count(*) FROM skiplock.pauses WHERE scope = 'queue'").fetchone()[0]


def test_a_cookie_kept_after_sign_out_signs_no_one_in(processes, db_url, db):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_api(processes, db_url, port)
    wait_ready(proc, base)
    skiplock.enqueue(db_url, "k", {}, queue="mail")

    kept = sign_in(base, TOKENS["admin"])
    before = page(base, kept)
    assert before.status_code == 200 and "Sign out" in before.text
    csrf = csrf_of(before.text)
    out = httpx.post(f"{base}/ui/logout", data={"csrf": csrf}, cookies=kept, timeout=10)
    assert out.status_code == 303

    # the copy of the cookie taken before sign-out, on each of the two workers (a connection each)
    replays = [page(base, kept) for _ in range(6)]
    assert [r.status_code for r in replays] == [302] * 6
    assert all(r.headers["location"].endswith("/ui/login") for r in replays)
    refused = [httpx.post(f"{base}/ui/queues/mail/pause", data={"csrf": csrf}, cookies=kept, timeout=10)
               for _ in range(6)]
    assert [r.status_code for r in refused] == [403] * 6
    assert paused(db) == 0
    assert db.execute("SELECT count(*) FROM skiplock.console_sessions_ended").fetchone()[0] == 1

    again = sign_in(base, TOKENS["admin"])  # signing in again opens a new session
    assert page(base, again).status_code == 200
    proc.signal(signal.SIGTERM)
    assert wait_exit(proc, 30)[0] == 0


def test_signing_out_a_token_ends_its_sessions_and_no_others(processes, db_url, db):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_api(processes, db_url, port)
    wait_ready(proc, base)

    admins = [sign_in(base, TOKENS["admin"]) for _ in range(3)]
    reader = sign_in(base, TOKENS["reader"])
    assert [page(base, c).status_code for c in [*admins, reader]] == [200] * 4

    done = skiplock_cli("tokens", "sign-out", "admin-bot", url=db_url)
    assert done.returncode == 0, done.stderr
    assert "admin-bot" in done.stdout

    assert [page(base, c).status_code for c in admins for _ in range(2)] == [302] * 6
    assert page(base, reader).status_code == 200
    assert page(base, sign_in(base, TOKENS["admin"])).status_code == 200  # a new sign-in works
    row = db.execute("SELECT actor, target, outcome, detail FROM skiplock.audit_log "
                     "WHERE action = 'console.sign_out_all'").fetchall()
    assert len(row) == 1 and row[0][0].startswith("cli:") and row[0][1:3] == ("admin-bot", "ok")
    assert row[0][3] == {"generation": 1}

    bad = skiplock_cli("tokens", "sign-out", "no such name!", url=db_url)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    proc.signal(signal.SIGTERM)
    assert wait_exit(proc, 30)[0] == 0

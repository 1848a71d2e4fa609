"""The console's live refresh in a real browser against a real `skiplock api`: while the database
holds a polling page's reads back (the workers page, which no task event changes, with the worker
registry locked, as a long migration would), the page never has two refreshes in flight, and
refreshing resumes once the reads return. The pages that follow the event feed refresh on its
events instead (test_console_live.py)."""

from __future__ import annotations

import psycopg

import skiplock
from skiplock.api.console.views import REFRESH_SECONDS
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.acceptance.test_console_browser import browser, sign_in  # noqa: F401  (the fixture)
from tests.support.harness import free_port, wait_for


def test_a_slow_refresh_is_never_overlapped_by_the_next(browser, processes, db_url):  # noqa: F811
    skiplock.enqueue(db_url, "t.noop", {}, queue="mail")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # the API's reads may wait longer than the window below for the lock (its default gives up sooner)
    wait_ready(start_api(processes, db_url, port, SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS="60"), base)
    context = browser.new_context()
    page = sign_in(context, base, "admin")
    page.goto(f"{base}/ui/workers")
    started, in_flight, most = [], set(), [0]

    def on_start(request):
        if request.resource_type == "fetch":
            started.append(request)
            in_flight.add(request)
            most[0] = max(most[0], len(in_flight))

    context.on("request", on_start)
    for event in ("requestfinished", "requestfailed"):
        context.on(event, lambda request: in_flight.discard(request))

    with psycopg.connect(db_url) as blocker:
        blocker.execute("LOCK TABLE skiplock.workers IN ACCESS EXCLUSIVE MODE")
        wait_for(lambda: page.wait_for_timeout(100) or started, 4 * REFRESH_SECONDS, message="a refresh started")
        # two and a half periods more: a timer that ignores the pending fetch starts two more in this time
        page.wait_for_timeout(2.5 * REFRESH_SECONDS * 1000)
        assert (len(started), len(in_flight)) == (1, 1)
        blocker.rollback()  # the reads return: the pending refresh finishes, the next one follows it
    wait_for(lambda: page.wait_for_timeout(100) or len(started) >= 2, 4 * REFRESH_SECONDS,
             message="refreshing resumed")
    assert most[0] == 1
    context.close()

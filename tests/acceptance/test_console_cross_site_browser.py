"""Arriving at the console from another site, in a real browser (Debian's Chromium driven by
Playwright) against a real `skiplock api`: a link on another site's page opens the console signed
in (the session cookie is SameSite=Lax), while a form on that page posting to the console, even
one that carries the victim's real CSRF token, changes nothing (a cross-site POST never carries
the cookie). The other site is a page served from `localhost`, a different site from `127.0.0.1`.
"""

from __future__ import annotations

import html

from tests.acceptance.test_api_process import start_api, wait_ready
from tests.acceptance.test_console_browser import browser, sign_in  # noqa: F401 (browser is a fixture)
from tests.integration.test_console import csrf_of
from tests.support.harness import free_port, scalar


def test_a_link_from_another_site_keeps_the_session_and_its_posts_change_nothing(
        browser, processes, db_url, db, receiver):  # noqa: F811
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    wait_ready(start_api(processes, db_url, port), base)
    context = browser.new_context()
    page = sign_in(context, base, "admin")
    csrf = csrf_of(page.content())  # what a page of the console holds; the other site could not know it
    target = f"{base}/ui/tasks?queue=mail"
    receiver.expect_request("/elsewhere").respond_with_data(
        f'<!doctype html><title>elsewhere</title><a id="link" href="{html.escape(target)}">console</a>'
        f'<form id="forged" method="post" action="{base}/ui/queues/mail/pause">'
        f'<input type="hidden" name="csrf" value="{html.escape(csrf)}"><button>go</button></form>',
        content_type="text/html")
    elsewhere = f"http://localhost:{receiver.port}/elsewhere"

    page.goto(elsewhere)
    with page.expect_navigation():
        page.click("#link")
    assert page.url == target  # not /ui/login: the session came along
    assert page.locator("form[action$='/ui/logout']").count() == 1

    page.goto(elsewhere)
    with page.expect_response(f"{base}/ui/queues/mail/pause") as answer:
        page.click("#forged button")
    assert answer.value.status == 403
    assert scalar(db, "SELECT count(*) FROM skiplock.pauses") == 0
    # the same form from the console's own page, with the same token, does pause: only the site differs
    page.goto(f"{base}/ui/")
    status = page.evaluate("""async ([csrf]) => (await fetch('/ui/queues/mail/pause',
        {method: 'POST', body: new URLSearchParams({csrf})})).status""", [csrf])
    assert status == 200  # the 303 back to the overview, followed
    assert scalar(db, "SELECT count(*) FROM skiplock.pauses") == 1
    context.close()

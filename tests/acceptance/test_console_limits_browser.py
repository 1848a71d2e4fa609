"""The console's Limits page in a real browser (Chromium driven by Playwright, as
test_console_browser.py) against a real `skiplock api`: reached from the navigation, it lists a
limit set through the API with what it holds back after real claims, refreshes by itself as the
numbers change, and passes axe (no serious or critical violation)."""

from __future__ import annotations

import httpx

import skiplock
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.acceptance.test_console_browser import Pages, browser, sign_in  # noqa: F401 (fixtures)
from tests.integration.test_api import TOKENS
from tests.support.harness import free_port


def test_the_limits_page_in_a_browser(browser, processes, db_url, store, tmp_path):
    from playwright.sync_api import expect

    shots = Pages(tmp_path / "screenshots")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    wait_ready(start_api(processes, db_url, port), base)
    bearer = {"Authorization": f"Bearer {TOKENS['admin']}"}
    assert httpx.put(f"{base}/v1/limits/mail.send", headers=bearer, timeout=10,
                     json={"concurrency": 1}).status_code == 201
    for key in ("a", "a", "b", "b", "b"):
        skiplock.enqueue(db_url, "mail.send", {}, queue="mail", concurrency_key=key)
    store.tasks.task_claim(["mail"], 10, "w-1", 60)
    assert len(store.tasks.task_claim_limited(["mail"], 10, "w-1", 60)) == 2

    context = browser.new_context()
    errors = []
    context.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page = sign_in(context, base, "reader")
    expect(page.locator('tr[data-queue="mail"] [data-field="throttled"]')).to_have_text("3")
    page.click("nav >> text=Limits")
    page.wait_for_url(f"{base}/ui/limits")
    row = page.locator('tr[data-limit="mail.send"]')
    for field, text in (("concurrency", "1"), ("rate", "—"), ("throttled", "3"), ("running", "2"),
                        ("busy_groups", "2"), ("saturation", "100 %")):
        expect(row.locator(f'[data-field="{field}"]')).to_have_text(text)
    shots.check(page, "limits")
    # the page refreshes itself: a deleted limit lets its tasks go, and the row goes
    assert httpx.delete(f"{base}/v1/limits/mail.send", headers=bearer, timeout=10).status_code == 204
    expect(page.locator("table.limits")).to_contain_text("No limit is set.", timeout=15_000)
    assert errors == []
    context.close()

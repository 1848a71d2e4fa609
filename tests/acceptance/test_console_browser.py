"""The web console in a real browser: Debian's Chromium driven by Playwright, against a real
`skiplock api` (gunicorn, two workers: a session opened on one is honoured by the other), a real
database with seeded tasks and a real worker. Signing in (and a bad token refused), the overview's
numbers, filtering to a failed task, resuming it and watching the page reach `completed` by
itself, pausing a queue and a schedule and firing the schedule by hand, the overview's throughput
chart, a new task appearing on the overview without a reload,
the webhooks and the worker in the registry, cancelling and purging the tasks of a filter,
retrying ticked tasks (the ticks kept across a live refresh), sending a signal (a bad payload
refused in the page first), a
reader without buttons whose forged POST is refused, and a POST without its CSRF token. Every
request stays on the server and no page logs an error. Every page is screenshotted into the
test's tmp dir and checked with axe-core from npm (no serious or critical violation).

Chromium must be installed (scripts/install-test-tools): when it cannot start, the test fails
with one line; it is never skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

import skiplock
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.integration.test_api import TOKENS
from tests.support.axe import report, serious_violations
from tests.support.harness import free_port, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Error as exc:
            pytest.fail(f"chromium cannot start ({CHROMIUM}): {str(exc).strip().splitlines()[0]}", pytrace=False)
        yield chromium
        chromium.close()


class Pages:
    """Screenshots every page it is shown into `directory` and runs axe on it."""

    def __init__(self, directory: Path):
        self.directory, self.saved = directory, []
        directory.mkdir(parents=True, exist_ok=True)

    def check(self, page, name: str) -> None:
        path = self.directory / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        self.saved.append(path)
        serious = serious_violations(page)
        assert not serious, f"{name}:\n{report(serious)}"


def sign_in(context, base: str, role: str):
    page = context.new_page()
    page.goto(f"{base}/")
    assert page.url == f"{base}/ui/login"
    page.fill("input[name=token]", TOKENS[role])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/ui/")
    return page


def test_the_console_in_a_browser(browser, processes, db_url, db, tmp_path):
    from playwright.sync_api import expect

    shots = Pages(tmp_path / "screenshots")
    for queue in ("mail", "mail", "mail", "bulk"):
        skiplock.enqueue(db_url, "t.noop", {}, queue=queue)
    failing = skiplock.enqueue(db_url, "console.fail_first", {"report": "daily"}, queue="reports")
    worker = processes.spawn(db_url, tasks="tests.support.console_handlers", env={"SKIPLOCK_QUEUES": "reports"})
    processes.wait_ready(worker)
    wait_for(lambda: db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (failing,)).fetchone()[0]
             == "failed", 30, message="the seeded task failed")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    wait_ready(start_api(processes, db_url, port), base)
    bearer = {"Authorization": f"Bearer {TOKENS['admin']}"}
    assert httpx.post(f"{base}/v1/schedules", headers=bearer, timeout=10,
                      json={"name": "nightly", "kind": "reports.daily", "cron": "0 3 * * *"}).status_code == 201
    assert httpx.post(f"{base}/v1/webhooks", headers=bearer, timeout=10,
                      json={"url": "https://93.184.216.34/hook", "events": ["task.*"]}).status_code == 201

    admin = browser.new_context()
    # everything the pages load comes from this server, and no page logs an error (a CSP refusal included)
    requested, errors = [], []
    admin.on("request", lambda r: requested.append(r.url))
    admin.on("console", lambda m: m.type == "error" and errors.append(m.text))
    admin.on("weberror", lambda e: errors.append(str(e.error)))
    # a bad token is refused
    page = admin.new_page()
    page.goto(f"{base}/ui/login")
    shots.check(page, "login")
    page.fill("input[name=token]", "not-a-token")
    with page.expect_response(f"{base}/ui/login") as refused:
        page.click("button[type=submit]")
    assert refused.value.status == 401
    expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    page.close()

    # signed in, the overview shows the seeded numbers
    page = sign_in(admin, base, "admin")
    mail = page.locator('tr[data-queue="mail"]')
    expect(mail.locator('[data-state="queued"]')).to_have_text("3")
    expect(mail.locator('[data-field="claimable"]')).to_have_text("3")
    expect(page.locator('tr[data-queue="bulk"] [data-state="queued"]')).to_have_text("1")
    expect(page.locator('tr[data-queue="reports"] [data-state="failed"]')).to_have_text("1")
    expect(page.locator('tr[data-queue="reports"] [data-state="queued"]')).to_have_text("0")
    # the throughput chart: the one failure of the last hour, as a bar and in the chart's accessible name
    chart = page.locator('svg.throughput[data-queue="reports"]')
    expect(chart).to_have_attribute("aria-label", "reports: 0 completed, 1 failed in the last hour")
    expect(chart.locator('g.bar[data-failed="1"] rect.failed')).to_have_count(1)
    shots.check(page, "overview")

    # filter to the failed task, open it, resume it: the page reaches completed by itself
    page.click("nav >> text=Tasks")
    page.select_option("select[name=state]", "failed")
    page.click("button:text('Filter')")
    page.wait_for_url(re.compile(r".*/ui/tasks\?.*state=failed"))
    rows = page.locator("tr[data-task]")
    expect(rows).to_have_count(1)
    shots.check(page, "tasks-failed")
    rows.locator("a").click()
    page.wait_for_url(f"{base}/ui/tasks/{failing}")
    expect(page.locator('[data-field="state"]')).to_have_text("failed")
    expect(page.locator('[data-field="error"]')).to_contain_text("first run fails on purpose")
    page.click("summary:text('Traceback')")
    expect(page.locator('[data-field="traceback"]')).to_contain_text("raise Fail(")
    expect(page.locator('[data-field="payload"]')).to_contain_text('"report": "daily"')
    shots.check(page, "task-failed")
    page.click("button:text('Resume')")
    page.wait_for_url(f"{base}/ui/tasks/{failing}")
    expect(page.locator('[data-field="state"]')).to_have_text("completed", timeout=30_000)
    events = page.locator("ol.timeline > li > strong")
    expect(events).to_contain_text(["queued", "running", "failed", "resumed", "running", "completed"])
    expect(page.locator('[data-field="result"]')).to_contain_text('"runs": 2')
    shots.check(page, "task-completed")

    # pause a queue from the overview
    page.click("nav >> text=Queues")
    page.locator('tr[data-queue="mail"] button:text("Pause")').click()
    page.wait_for_url(f"{base}/ui/")
    expect(page.locator('tr[data-queue="mail"] [data-field="paused"]')).to_have_text("paused")
    expect(page.locator('tr[data-queue="mail"] button:text("Resume")')).to_be_visible()
    assert db.execute("SELECT scope, name FROM skiplock.pauses").fetchall() == [("queue", "mail")]
    shots.check(page, "overview-paused")
    # the page keeps itself current: a task enqueued now shows up without a reload (the marker survives)
    page.evaluate("window.notReloaded = true")
    skiplock.enqueue(db_url, "t.noop", {}, queue="mail")
    expect(page.locator('tr[data-queue="mail"] [data-state="queued"]')).to_have_text("4", timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
    page.click("nav >> text=Audit")
    expect(page.locator("table.audit tbody tr").first).to_contain_text("queue.pause")
    shots.check(page, "audit")
    assert db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log WHERE action NOT LIKE '%.create'"
                      " ORDER BY id").fetchall() == [("admin-bot", "task.resume", str(failing), "ok"),
                                                      ("admin-bot", "queue.pause", "mail", "ok")]

    # the schedules (one paused from here), the webhooks and the worker registry
    page.click("nav >> text=Schedules")
    page.locator('tr[data-schedule="nightly"] button:text("Pause")').click()
    page.wait_for_url(f"{base}/ui/schedules")
    expect(page.locator('tr[data-schedule="nightly"] [data-field="enabled"]')).to_have_text("paused")
    # fired by hand (paused or not), twice in one minute: one task, one decision on the page
    nightly = page.locator('tr[data-schedule="nightly"]')
    nightly.locator('button:text("Fire now")').click()
    page.wait_for_url(re.compile(r".*/ui/schedules\?fired=.*"))
    fired_url = page.url
    expect(nightly.locator('li[data-outcome="fired"]')).to_contain_text("fired now by admin-bot")
    with page.expect_navigation():
        nightly.locator('button:text("Fire now")').click()
    fired = db.execute("SELECT count(*) FROM skiplock.tasks WHERE kind = 'reports.daily'").fetchone()[0]
    if page.url == fired_url:  # the same minute (the usual case): the same task
        assert fired == 1
    expect(nightly.locator('li[data-outcome="fired"]')).to_have_count(fired)
    shots.check(page, "schedules")
    page.click("nav >> text=Webhooks")
    expect(page.locator("tr[data-webhook]")).to_contain_text("https://93.184.216.34/hook")
    shots.check(page, "webhooks")
    page.click("nav >> text=Deliveries")
    expect(page.locator("table.deliveries")).to_be_visible()
    shots.check(page, "deliveries")
    page.click("nav >> text=Workers")
    expect(page.locator("tr[data-worker]")).to_have_count(1)
    expect(page.locator("tr[data-worker]")).to_contain_text("reports")
    shots.check(page, "workers")

    # bulk actions on the filter shown: cancel the queued task of "bulk", then purge it (after a confirm)
    page.goto(f"{base}/ui/tasks?queue=bulk")
    page.click("button:text('Cancel all waiting, queued or running')")
    expect(page.get_by_role("status")).to_have_text("1 task(s) changed.")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("button:text('Purge all finished')")  # the click returns once the dialog is handled
    assert asked == ["Delete every finished task of this filter, with its events?"]  # dismissed: nothing sent
    assert db.execute("SELECT state FROM skiplock.tasks WHERE queue = 'bulk'").fetchall() == [("cancelled",)]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:text('Purge all finished')")
    expect(page.get_by_role("status")).to_have_text("1 task(s) changed.")
    expect(page.locator("tr[data-task]")).to_have_count(0)
    shots.check(page, "tasks-bulk")
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE queue = 'bulk'").fetchone()[0] == 0

    # bulk retry of ticked tasks: tick two of three cancelled ones; a live refresh (a fourth task
    # appears without a reload) keeps the ticks; "Retry selected" retries exactly those two
    again = [skiplock.enqueue(db_url, "t.noop", {}, queue="again") for _ in range(3)]
    assert httpx.post(f"{base}/v1/tasks:cancel", headers=bearer, timeout=10,
                      json={"queue": "again"}).json()["changed"] == 3
    page.goto(f"{base}/ui/tasks?queue=again")
    expect(page.locator("tr[data-task]")).to_have_count(3)
    for task_id in again[:2]:
        page.check(f'input[aria-label="select {task_id}"]')
    page.evaluate("window.notReloaded = true")
    fourth = skiplock.enqueue(db_url, "t.noop", {}, queue="again")
    expect(page.locator("tr[data-task]")).to_have_count(4, timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
    ticked = page.eval_on_selector_all("tr[data-task] input[type=checkbox]:checked", "boxes => boxes.map(b => b.value)")
    assert sorted(ticked) == sorted(str(t) for t in again[:2])
    page.click("button:text('Retry selected')")
    expect(page.get_by_role("status")).to_have_text("2 task(s) changed.")
    states = dict(db.execute("SELECT id, state FROM skiplock.tasks WHERE queue = 'again'").fetchall())
    assert states == {again[0]: "queued", again[1]: "queued", again[2]: "cancelled", fourth: "queued"}
    assert db.execute("SELECT actor, action, outcome, detail->>'changed' FROM skiplock.audit_log "
                      "WHERE action = 'task.retry_many'").fetchall() == [("admin-bot", "task.retry_many", "ok", "2")]
    shots.check(page, "tasks-retried")

    # a signal sent from its page: a payload that is not JSON is refused in the page (what was typed
    # kept), then it is sent and listed
    page.click("nav >> text=Signals")
    page.wait_for_url(f"{base}/ui/signals")
    page.fill("input[name=name]", "nightly.done")
    page.fill("textarea[name=payload]", "{nope")
    with page.expect_response(f"{base}/ui/signals") as refused:
        page.click("button:text('Send signal')")
    assert refused.value.status == 400
    expect(page.get_by_role("alert")).to_contain_text("payload is not valid JSON")
    expect(page.locator("input[name=name]")).to_have_value("nightly.done")
    page.fill("textarea[name=payload]", '{"ok": true}')
    page.click("button:text('Send signal')")
    expect(page.get_by_role("status")).to_have_text("Sent nightly.done: 0 task(s) woken.")
    expect(page.locator('tr[data-signal="nightly.done"] [data-field="payload"]')).to_have_text('{"ok":true}')
    shots.check(page, "signals")
    assert db.execute("SELECT outcome FROM skiplock.audit_log WHERE action = 'signal.send' ORDER BY id").fetchall() \
        == [("request.invalid",), ("ok",)]

    # a POST without its CSRF token is refused, even with a valid session
    assert page.request.post(f"{base}/ui/queues/bulk/pause", form={}).status == 403

    # a reader sees no action button, and a forged POST is refused
    reader = browser.new_context()
    page = sign_in(reader, base, "reader")
    expect(page.locator("main button")).to_have_count(0)
    expect(page.locator("nav >> text=Audit")).to_have_count(0)
    shots.check(page, "overview-reader")
    page.goto(f"{base}/ui/tasks/{failing}")
    expect(page.locator("main button")).to_have_count(0)
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    for path in ("/ui/queues/bulk/pause", f"/ui/tasks/{failing}/cancel"):
        assert page.request.post(f"{base}{path}", form={"csrf": csrf}).status == 403, path
    assert db.execute("SELECT count(*) FROM skiplock.pauses").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM skiplock.audit_log WHERE actor = 'reader-bot'").fetchone()[0] == 0

    assert requested and [url for url in requested if not url.startswith(f"{base}/")] == []
    assert f"{base}/ui/static/console.js" in requested and f"{base}/ui/static/console.css" in requested
    # the only errors logged: the answers refused on purpose (the bad token's 401, the forged POSTs'
    # 403, the signal's bad payload's 400)
    assert [e for e in errors if not any(f"status of {n}" in e for n in (400, 401, 403))] == []
    print("screenshots:", *shots.saved, sep="\n  ")
    assert all(p.stat().st_size > 0 for p in shots.saved)
    admin.close()
    reader.close()

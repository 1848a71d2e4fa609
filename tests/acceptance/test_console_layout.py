"""Every console page in a real browser (Debian's Chromium via Playwright) at 1400 and 400 px wide,
in the light theme and in the dark one, against a real `skiplock api`, a real worker and a database
holding something on every page (tasks of each outcome, one failed with a traceback, a schedule, a
webhook and its deliveries, a limit, a signal): no page scrolls sideways (a wide table scrolls in
its own box), axe-core finds no serious or critical violation (contrast included, in both themes),
and a screenshot of each page at each width goes to the test's folder. Then the empty console:
each empty page says how to make the first thing, at 400 px too.

What the pages hold is tested in tests/integration/test_console_pages.py; the live updates at both
widths in test_console_live.py.
"""

from __future__ import annotations

import httpx
import pytest

import skiplock
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.acceptance.test_console_browser import Pages, browser, sign_in  # noqa: F401 (the fixture)
from tests.integration.test_api import TOKENS
from tests.support.harness import free_port, wait_for

WIDTHS = (1400, 400)
HEIGHT = 900
# how far the page's own width may pass the viewport's: none (a rounding pixel at most)
SLACK_PX = 1


def _overflow(page) -> int:
    """How many CSS pixels the page is wider than its viewport (0: no sideways scroll)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


def _too_wide(page) -> list[str]:
    """The outermost elements that reach past the viewport's right edge (what a failure names)."""
    return page.evaluate("""() => {
        const width = document.documentElement.clientWidth, out = [];
        for (const el of document.querySelectorAll("body *")) {
            if (el.getBoundingClientRect().right > width + 1 && !out.some(o => o.contains(el))
                && !el.closest(".scroll")) out.push(el);
        }
        return out.slice(0, 5).map(el => el.tagName.toLowerCase() + (el.className ? "." + el.className : ""));
    }""")


def _background_luminance(page) -> float:
    rgb = page.evaluate("getComputedStyle(document.body).backgroundColor")
    red, green, blue = (int(part) for part in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def _seed(db_url, db, processes, base) -> dict[str, str]:
    bearer = {"Authorization": f"Bearer {TOKENS['admin']}"}
    assert httpx.post(f"{base}/v1/webhooks", headers=bearer, timeout=10,
                      json={"url": "https://93.184.216.34/a-rather-long-path/for-the-webhook-endpoint/hook",
                            "events": ["task.*"]}).status_code == 201
    assert httpx.post(f"{base}/v1/schedules", headers=bearer, timeout=10,
                      json={"name": "nightly-report-for-the-finance-team", "kind": "reports.daily",
                            "cron": "0 3 * * 1-5", "timezone": "Europe/Berlin"}).status_code == 201
    assert httpx.put(f"{base}/v1/limits/mail.send", headers=bearer, timeout=10,
                     json={"concurrency": 2, "rate": "10/s"}).status_code in (200, 201)
    assert httpx.post(f"{base}/v1/signals", headers=bearer, timeout=10,
                      json={"name": "order.42.paid", "payload": {"amount": 12}}).status_code in (200, 201)
    crashed = skiplock.enqueue(db_url, "console.crash", {"text": "x"}, queue="reports")
    for queue in ("mail", "mail", "bulk-imports-from-the-warehouse"):
        skiplock.enqueue(db_url, "t.noop", {"to": "someone@example.com"}, queue=queue)
    worker = processes.spawn(db_url, tasks="tests.support.console_handlers", env={"SKIPLOCK_QUEUES": "reports"})
    processes.wait_ready(worker)
    wait_for(lambda: db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (crashed,)).fetchone()[0]
             == "failed", 30, message="the seeded task failed")
    return {"overview": "/ui/", "overview-day": "/ui/?range=day", "tasks": "/ui/tasks", "tasks-failed":
            "/ui/tasks?state=failed", "task": f"/ui/tasks/{crashed}", "schedules": "/ui/schedules",
            "schedule-new": "/ui/schedules/new", "schedule-edit": "/ui/schedules/nightly-report-for-the-finance-team/edit",
            "limits": "/ui/limits", "signals": "/ui/signals", "workers": "/ui/workers", "webhooks": "/ui/webhooks",
            "deliveries": "/ui/deliveries", "audit": "/ui/audit"}


def _walk(browser, base, paths, shots, width, scheme) -> list[str]:  # noqa: F811
    """Every page at this width and theme: screenshot, axe, no sideways scroll. The pages looked at."""
    context = browser.new_context(viewport={"width": width, "height": HEIGHT}, color_scheme=scheme)
    errors = []
    context.on("weberror", lambda e: errors.append(str(e.error)))
    page = sign_in(context, base, "admin")
    seen = []
    for name, path in paths.items():
        page.goto(f"{base}{path}")
        page.wait_for_load_state("load")
        shots.check(page, f"{name}-{width}-{scheme}")
        assert _overflow(page) <= SLACK_PX, \
            f"{path} at {width} px ({scheme}) scrolls sideways by {_overflow(page)} px: {_too_wide(page)}"
        luminance = _background_luminance(page)
        assert (luminance < 0.2) if scheme == "dark" else (luminance > 0.9), (path, scheme, luminance)
        seen.append(name)
    # the schedule form after a check: its next five fires, then Save
    page.goto(f"{base}/ui/schedules/new")
    page.fill("#s-name", "hourly-cleanup")
    page.fill("#s-kind", "maintenance.cleanup")
    page.fill("#s-cron", "@hourly")
    page.click("button[value=check]")
    assert page.locator('[data-field="next-fires"] li').count() == 5
    shots.check(page, f"schedule-checked-{width}-{scheme}")
    assert _overflow(page) <= SLACK_PX
    seen.append("schedule-checked")
    context.close()
    assert errors == []
    return seen


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_width_passes_axe_in_both_themes_and_is_screenshotted(
        browser, processes, db_url, db, tmp_path, width):  # noqa: F811
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    wait_ready(start_api(processes, db_url, port), base)
    paths = _seed(db_url, db, processes, base)
    shots = Pages(tmp_path / "screenshots")
    for scheme in ("light", "dark"):
        seen = _walk(browser, base, paths, shots, width, scheme)
        assert len(seen) == len(paths) + 1
    assert len(shots.saved) == 2 * (len(paths) + 1)
    assert all(path.stat().st_size > 5000 for path in shots.saved)  # a page, not a blank


@pytest.mark.parametrize("width", WIDTHS)
def test_the_empty_console_says_how_to_start_at_each_width(browser, processes, db_url, tmp_path, width):  # noqa: F811
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    wait_ready(start_api(processes, db_url, port), base)
    shots = Pages(tmp_path / "screenshots")
    context = browser.new_context(viewport={"width": width, "height": HEIGHT})
    page = sign_in(context, base, "admin")
    starts = {"/ui/": "skiplock enqueue", "/ui/tasks": "skiplock enqueue", "/ui/schedules": "schedules add",
              "/ui/workers": "skiplock worker", "/ui/webhooks": "webhooks add", "/ui/limits": "limits set"}
    for path, command in starts.items():
        page.goto(f"{base}{path}")
        empty = page.locator("td.empty")
        assert empty.count() == 1 and command in empty.inner_text(), path
        assert _overflow(page) <= SLACK_PX, f"{path} at {width} px scrolls sideways: {_too_wide(page)}"
        shots.check(page, f"empty{path.replace('/', '-')}-{width}")
    context.close()

"""The accessibility checker the console's browser tests rely on finds what it should: axe-core from
npm (tests/browser), evaluated in Debian's Chromium, reports a button without a name and text
below the contrast bound, and nothing on a page without them. Without this, an axe that failed to
load or ran on nothing would pass every console page."""

from __future__ import annotations

import json

from tests.acceptance.test_console_browser import browser  # noqa: F401  (the fixture)
from tests.support.axe import AXE_SCRIPT, axe_version, serious_violations

BAD_PAGE = """<!doctype html><html lang="en"><head><title>bad</title></head><body><main>
<h1>Bad</h1><button></button><p style="color:#ccc;background:#fff">faint text</p></main></body></html>"""
GOOD_PAGE = """<!doctype html><html lang="en"><head><title>good</title></head><body><main>
<h1>Good</h1><button>Retry</button><p style="color:#222;background:#fff">plain text</p></main></body></html>"""


def test_axe_from_npm_reports_a_nameless_button_and_faint_text_and_passes_a_clean_page(browser):  # noqa: F811
    # the installed axe-core is the one tests/browser pins, not one left over
    pinned = json.loads((AXE_SCRIPT.parents[2] / "package.json").read_text())["devDependencies"]["axe-core"]
    assert axe_version() == pinned
    page = browser.new_page()
    page.set_content(BAD_PAGE)
    found = sorted(v["id"] for v in serious_violations(page))
    assert found == ["button-name", "color-contrast"]
    page.set_content(GOOD_PAGE)
    assert serious_violations(page) == []
    page.close()

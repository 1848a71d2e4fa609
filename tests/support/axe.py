"""axe-core, the accessibility checker, run inside a Playwright page.

axe-core comes from the npm registry, pinned by tests/browser/package-lock.json and installed by
`make test` (`npm ci` there); the script is read from that directory and evaluated in the page, so
no CDN is asked and the console's Content-Security-Policy (no inline scripts) stays as served."""

from __future__ import annotations

from pathlib import Path

import pytest

AXE_SCRIPT = Path(__file__).resolve().parents[1] / "browser" / "node_modules" / "axe-core" / "axe.min.js"

# the impacts a page must not have: axe's serious and critical violations
REFUSED_IMPACTS = ("serious", "critical")


def axe_version() -> str:
    import json

    return json.loads((AXE_SCRIPT.parent / "package.json").read_text())["version"]


def serious_violations(page) -> list[dict]:
    """axe's serious and critical violations on the page as it stands."""
    if not AXE_SCRIPT.exists():
        pytest.fail("axe-core is not installed: run `make test` (npm ci in tests/browser)", pytrace=False)
    page.evaluate(AXE_SCRIPT.read_text())
    results = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [v for v in results["violations"] if v["impact"] in REFUSED_IMPACTS]


def report(violations: list[dict]) -> str:
    """One line per violation and the first few elements it names."""
    lines = []
    for violation in violations:
        targets = [" ".join(map(str, node["target"])) for node in violation["nodes"][:3]]
        lines.append(f"{violation['impact']} {violation['id']}: {violation['help']} at {'; '.join(targets)}")
    return "\n".join(lines)

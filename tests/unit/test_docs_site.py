"""The docs site builds with `mkdocs build --strict` (mkdocs.yml): a link to a page or an anchor
that does not exist, in docs/ or in the README, chart README and benchmark docs the site takes in,
fails the build and so this test. The site goes to a temporary directory; the repository is not
written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.timeout(180)


def _build(config: str, site_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about MkDocs 2.0
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
                           "--site-dir", str(site_dir)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=150)


def test_the_site_builds_strictly(tmp_path):
    done = _build(str(ROOT / "mkdocs.yml"), tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    # the home page is the README; the chart README and the benchmark results are pages of their own
    assert {"index.html", "OPERATIONS/index.html", "ARCHITECTURE/index.html", "charts/skiplock/index.html",
            "tests/benchmarks/RESULTS/index.html", "TRACING/index.html", "examples/fastapi/index.html"} <= pages
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="OPERATIONS/"' in home  # the README's docs/OPERATIONS.md, as a link within the site


def test_a_broken_link_fails_the_build(tmp_path):
    """The same build over a copy of the docs with one anchor that does not exist."""
    import shutil

    copy = tmp_path / "repo"
    for name in ("mkdocs.yml", "README.md"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, copy / name)
    for folder in ("docs", "scripts"):
        shutil.copytree(ROOT / folder, copy / folder)
    recipes = [str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("README.md")]
    for path in ("charts/skiplock/README.md", "tests/benchmarks/README.md", "tests/benchmarks/RESULTS.md", *recipes):
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, copy / path)
    with open(copy / "README.md", "a") as readme:
        readme.write("\nSee [the runbook](docs/OPERATIONS.md#no-such-section).\n")
    done = _build(str(copy / "mkdocs.yml"), tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-section" in done.stdout + done.stderr

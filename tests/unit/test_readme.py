"""The README is the users' page: short, and its performance table is one dated run of
tests/benchmarks/RESULTS.md, copied as that run's section has it."""

from __future__ import annotations

import re

from markdown.extensions.toc import slugify

from tests.support.harness import ROOT

README = ROOT / "README.md"
RESULTS = ROOT / "tests" / "benchmarks" / "RESULTS.md"
MAX_BYTES = 12 * 1024


def _section(text: str, heading: str) -> str:
    return text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


def _tables(text: str) -> list[list[str]]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def test_the_readme_is_at_most_12_kb():
    size = len(README.read_bytes())
    assert size <= MAX_BYTES, f"README.md is {size} bytes; move detail to docs/ (at most {MAX_BYTES})"


def test_the_performance_table_is_the_run_it_names():
    performance = _section(README.read_text(), "## Performance")
    (anchor,) = re.findall(r"\(tests/benchmarks/RESULTS\.md#([\w-]+)\)", performance)
    results = RESULTS.read_text()
    headings = {slugify(h, "-"): h for h in re.findall(r"(?m)^## (.+)$", results)}
    assert anchor in headings, f"RESULTS.md has no section #{anchor}"
    run = _section(results, "## " + headings[anchor])
    assert re.match(r"\d{4}-\d{2}-\d{2}", headings[anchor]), "the run's section starts with its date"
    assert headings[anchor][:10] in performance, "the README names the run's date"
    (table,) = _tables(performance)
    assert table == _tables(run)[0]

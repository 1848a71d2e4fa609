"""The docs' generated tables are what their sources give now: the SKIPLOCK_* tables of the
README, docs/CONFIGURATION.md and docs/CONTRACT.md (from settings.VARIABLES) and the chart
README's values table (from the `# --` comments of values.yaml). A table edited by hand, or a
source changed without running `python scripts/gen_docs.py`, fails here."""

from __future__ import annotations

import difflib
import importlib.util
import sys

import pytest
import yaml

from skiplock.engine import settings
from tests.support.harness import ROOT


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_generator()


@pytest.mark.parametrize("path,name,make", gen_docs.BLOCKS, ids=[b[1] for b in gen_docs.BLOCKS])
def test_generated_table_is_current(path, name, make):
    committed = gen_docs.current(path, name)
    fresh = make() + "\n"
    diff = "\n".join(difflib.unified_diff(committed.splitlines(), fresh.splitlines(), "committed", "generated",
                                          lineterm="", n=1))
    assert committed == fresh, (f"{path.relative_to(ROOT)} ({name}) differs from its source; run "
                                f"`python scripts/gen_docs.py`:\n{diff}")


def test_the_check_mode_passes(capsys):
    assert gen_docs.main(["--check"]) == 0, capsys.readouterr().err


def test_the_tables_come_from_the_declaration(monkeypatch):
    """A default or meaning changed in settings.VARIABLES is what the tables then say."""
    changed = tuple(v._replace(default=7.0, meaning="how often, changed") if v.name == "REAPER_SECONDS" else v
                    for v in settings.VARIABLES)
    monkeypatch.setattr(settings, "VARIABLES", changed)
    row = "| `SKIPLOCK_REAPER_SECONDS` | `7` | how often, changed |"
    assert row in gen_docs.env_contract().splitlines()
    assert any(line.startswith(row[:-2]) for line in gen_docs.env_full().splitlines())


def test_every_contract_variable_is_in_the_contract_table():
    table = gen_docs.current(ROOT / "docs" / "CONTRACT.md", "env-contract")
    for v in settings.VARIABLES:
        assert (f"`SKIPLOCK_{v.name}`" in table) == bool(v.contract), v.name


# ---- the chart's values table ---------------------------------------------------------------------

def _leaves(value, path=()):
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _leaves(child, path + (key,))
    else:
        yield ".".join(path)


def test_every_value_is_in_the_values_table():
    """Each leaf of values.yaml is a row, or inside a documented collection that is one row."""
    text = (ROOT / "charts" / "skiplock" / "values.yaml").read_text()
    keys = [key for key, *_ in gen_docs.chart_values(text)]
    assert len(keys) == len(set(keys))
    missing = [leaf for leaf in _leaves(yaml.safe_load(text))
               if not any(leaf == key or leaf.startswith(key + ".") for key in keys)]
    assert missing == []


def test_values_table_follows_helm_docs_conventions():
    text = """\
# a header comment, not a description

# -- Top-level key.
name: x
image:
  # -- The repository; a description
  # over two lines.
  repository: skiplock
  tag: ""
# -- A documented map is one row.
resources:
  requests:
    # -- not listed: inside a documented collection
    cpu: 50m
# -- A list | with a pipe.
hosts:
  - host: a.example
    paths: [/]
port: 8080
"""
    rows = gen_docs.chart_values(text)
    assert rows == [
        ("name", "string", '"x"', "Top-level key."),
        ("image.repository", "string", '"skiplock"', "The repository; a description over two lines."),
        ("resources", "object", '{"requests":{"cpu":"50m"}}', "A documented map is one row."),
        ("hosts", "list", '[{"host":"a.example","paths":["/"]}]', "A list | with a pipe."),
    ]
    assert gen_docs._cell("a | b") == "a \\| b"

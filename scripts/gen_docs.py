#!/usr/bin/env python3
"""Writes the docs' generated tables from their sources, between marker comments:

  README.md, docs/CONTRACT.md, docs/CONFIGURATION.md   the SKIPLOCK_* tables, from
                                                       skiplock.engine.settings.VARIABLES (declared by each role's module)
  charts/skiplock/README.md                            the values table, from the `# --` comments of
                                                       charts/skiplock/values.yaml (helm-docs' conventions)

A block is the text between `<!-- BEGIN generated: NAME ... -->` and `<!-- END generated: NAME -->`;
everything outside the blocks is the docs' own. `--check` writes nothing and exits 1 when a block
differs from what its source gives (tests/unit/test_generated_docs.py runs the same comparison).

It reads the sources only: no database, no Helm.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))

from skiplock.engine import settings  # noqa: E402  (after the path, so a checkout without an install works)

CHART = ROOT / "charts" / "skiplock"


# ---- the SKIPLOCK_* tables ------------------------------------------------------------------------

def shown_default(variable: settings.Variable) -> str:
    if variable.shown is not None:
        return variable.shown
    value = variable.default
    if value in (None, "", ()):
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def _row(variable: settings.Variable, meaning: str) -> str:
    return f"| `{settings.PREFIX}{variable.name}` | {shown_default(variable)} | {_cell(meaning)} |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


_ENV_HEADER = ["| variable | default | meaning |", "|---|---|---|"]


def env_contract() -> str:
    """docs/CONTRACT.md: the variables the contract names, in their declared rows (Variable.contract),
    with their meaning as the contract has it."""
    rows = sorted((v for v in settings.VARIABLES if v.contract), key=lambda v: v.contract)
    return "\n".join(_ENV_HEADER + [_row(v, v.meaning) for v in rows])


def env_readme() -> str:
    """README.md: the few a user sets first."""
    rows = sorted((v for v in settings.VARIABLES if v.readme), key=lambda v: v.readme)
    return "\n".join(_ENV_HEADER + [_row(v, v.meaning) for v in rows])


def env_full() -> str:
    """docs/CONFIGURATION.md: every variable, one table per group (settings.GROUPS' order), with what
    the full table adds to the meaning."""
    parts = []
    for group in settings.GROUPS:
        rows = [_row(v, f"{v.meaning}; {v.more}" if v.more else v.meaning)
                for v in settings.VARIABLES if v.group == group]
        parts.append("\n".join([f"### {group}", ""] + _ENV_HEADER + rows))
    return "\n\n".join(parts)


# ---- the chart's values table (helm-docs' conventions) --------------------------------------------

_KEY = re.compile(r"^(\s*)([A-Za-z][\w.-]*):(.*)$")


def chart_values(text: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every key whose comment block starts with `# --`.

    As helm-docs does: the description is the `# --` line and the comment lines after it, up to the
    key; a documented key whose value is a non-empty map or list is one row with the whole value as
    its default, and the keys inside it are not listed. Rows come in the file's order."""
    data = yaml.safe_load(text)
    rows = []
    comment: list[str] = []
    parents: list[tuple[int, str]] = []   # (indent, key) of the keys enclosing the current line
    inside: int | None = None             # indent of a documented collection being skipped
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = _KEY.match(line)
        if not stripped or not match:     # a blank line or a list item ends a comment block
            comment = []
            continue
        indent, key = len(match.group(1)), match.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = [k for _, k in parents] + [key]
        parents.append((indent, key))
        description, comment = _description(comment), []
        if inside is not None:
            if indent > inside:
                continue
            inside = None
        if description is None:
            continue
        value = _lookup(data, path)
        rows.append((".".join(path), _type(value), _json(value), description))
        if isinstance(value, (dict, list)) and value:
            inside = indent
    return rows


def _description(comment: list[str]) -> str | None:
    starts = [i for i, c in enumerate(comment) if c.startswith("# --")]
    if not starts:
        return None
    lines = [comment[starts[-1]][len("# --"):]] + [c[1:] for c in comment[starts[-1] + 1:]]
    return " ".join(part.strip() for part in lines if part.strip())


def _lookup(data, path: list[str]):
    for key in path:
        data = data[key]
    return data


# helm-docs' type names; bool first, since a bool is also an int
_HELM_TYPES = ((bool, "bool"), (int, "int"), (float, "float"), (list, "list"), (dict, "object"))


def _type(value) -> str:
    return next((name for kind, name in _HELM_TYPES if isinstance(value, kind)), "string")


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def chart_values_table() -> str:
    rows = chart_values((CHART / "values.yaml").read_text())
    lines = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    lines += [f"| {key} | {kind} | `{_cell(default)}` | {_cell(text)} |" for key, kind, default, text in rows]
    return "\n".join(lines)


# ---- the blocks -----------------------------------------------------------------------------------

# (file, block name, what writes it)
BLOCKS: tuple[tuple[Path, str, Callable[[], str]], ...] = (
    (ROOT / "README.md", "env-readme", env_readme),
    (ROOT / "docs" / "CONTRACT.md", "env-contract", env_contract),
    (ROOT / "docs" / "CONFIGURATION.md", "env-full", env_full),
    (CHART / "README.md", "chart-values", chart_values_table),
)


def _block_re(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN generated: {re.escape(name)}\b[^>]*-->\n)(.*?)(<!-- END generated: "
                      rf"{re.escape(name)} -->)", re.S)


def current(path: Path, name: str) -> str:
    """The block's text as the file holds it now."""
    found = _block_re(name).search(path.read_text())
    if found is None:
        raise LookupError(f"{path.relative_to(ROOT)}: no block '{name}' (<!-- BEGIN generated: {name} ... -->)")
    return found.group(2)


def rewritten(path: Path, name: str, make: Callable[[], str]) -> str:
    """The whole file with the block replaced by what its source gives now."""
    text = path.read_text()
    current(path, name)  # the markers must be there
    return _block_re(name).sub(lambda m: m.group(1) + make() + "\n" + m.group(3), text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, name, make in BLOCKS:
        text = rewritten(path, name, make)
        if text == path.read_text():
            continue
        stale.append(f"{path.relative_to(ROOT)} ({name})")
        if not args.check:
            path.write_text(text)
    if stale:
        verb = "stale" if args.check else "rewrote"
        print(f"{verb}: " + ", ".join(stale), file=sys.stderr)
        if args.check:
            print("run: python scripts/gen_docs.py", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

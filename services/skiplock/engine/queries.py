"""Loads the named SQL statements from engine/sql/*.sql.

A statement starts at a `-- name: <name>` line and runs to the next one. A name starting with
`_` is a fragment (e.g. a list of CTEs) that statements include as `{{_name}}`, so one piece of
SQL can serve a statement of its own and a combined one. Statements are written against the
`skiplock` schema; another schema (SKIPLOCK_DB_SCHEMA) is substituted at load time.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.M)
_SCHEMA_REF = re.compile(r"\bskiplock\.")
_INCLUDE = re.compile(r"\{\{(_\w+)\}\}")


def parse(text: str) -> dict[str, str]:
    parts = _NAME_LINE.split(text)
    statements = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in statements:
            raise ValueError(f"duplicate statement name {name!r}")
        statements[name] = minify(body).rstrip(";").rstrip()
    return statements


# A string literal ('' escapes a quote inside it; an unterminated one runs to the end), a comment,
# a run of whitespace, a run of anything else, or a lone '-' (the start of '->>', say).
_TOKEN = re.compile(r"'(?:[^']|'')*'?|--[^\n]*|\s+|[^'\s-]+|-")


def minify(sql: str) -> str:
    """Drop `--` comments and collapse whitespace outside string literals.

    The comments are for readers of the .sql files; the driver converts and caches only
    statements under 4 KiB, and the worker's settle statement is over that with them.
    """
    out: list[str] = []
    space = False  # whitespace (or a comment) since the last token written
    for token in _TOKEN.findall(sql):
        first = token[0]
        if first.isspace() or token.startswith("--"):
            space = True
            continue
        # no space is needed around a comma, a parenthesis or an equals sign
        if space and out and out[-1][-1] not in "(,=" and (first not in ",)=" or first == "'"):
            out.append(" ")
        out.append(token)
        space = False
    return "".join(out).strip()  # an unterminated literal may end in whitespace


def qualify(sql: str, schema: str) -> str:
    """Point every `skiplock.` reference at `schema` (validated by Settings to be an identifier)."""
    return sql if schema == "skiplock" else _SCHEMA_REF.sub(f"{schema}.", sql)


def expand(statements: dict[str, str]) -> dict[str, str]:
    """Replace `{{_fragment}}` includes; return the statements without the fragments."""
    def include(match: re.Match) -> str:
        name = match.group(1)
        if name not in statements:
            raise ValueError(f"unknown SQL fragment {name!r}")
        return statements[name]

    return {name: _INCLUDE.sub(include, sql) for name, sql in statements.items() if not name.startswith("_")}


@functools.lru_cache(maxsize=None)
def load(schema: str = "skiplock") -> dict[str, str]:
    statements: dict[str, str] = {}
    for entry in sorted(resources.files("skiplock.engine").joinpath("sql").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".sql"):
            for name, sql in parse(entry.read_text(encoding="utf-8")).items():
                if name in statements:
                    raise ValueError(f"statement {name!r} defined twice")
                statements[name] = qualify(sql, schema)
    return expand(statements)

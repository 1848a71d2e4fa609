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


def minify(sql: str) -> str:
    """Drop `--` comments and collapse whitespace outside string literals.

    The comments are for readers of the .sql files; the driver converts and caches only
    statements under 4 KiB, and the worker's settle statement is over that with them.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch == "'":  # a literal, copied as is ('' is an escaped quote inside it)
            end = i + 1
            while end < n:
                if sql[end] == "'":
                    if end + 1 < n and sql[end + 1] == "'":
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i:end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            newline = sql.find("\n", i)
            i = n if newline < 0 else newline
        elif ch.isspace():
            while i < n and sql[i].isspace():
                i += 1
            if out and out[-1] not in (" ", "(", ",", "="):
                out.append(" ")
        else:
            if ch in ",)=" and out and out[-1] == " ":
                out.pop()  # no space is needed around a comma, a parenthesis or an equals sign
            out.append(ch)
            i += 1
    return "".join(out).strip()


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

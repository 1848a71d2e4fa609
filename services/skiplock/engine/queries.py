"""Loads the named SQL statements from engine/sql/*.sql.

A statement starts at a `-- name: <name>` line and runs to the next one. A name starting with
`_` is a fragment (e.g. a list of CTEs) that statements include as `{{_name}}`, so one piece of
SQL can serve a statement of its own and a combined one. Statements are written against the
`skiplock` schema; another schema (SKIPLOCK_DB_SCHEMA) is substituted at load time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.M)
_SCHEMA_REF = re.compile(r"\bskiplock\.")
_INCLUDE = re.compile(r"\{\{(_\w+)\}\}")


def split(text: str) -> dict[str, str]:
    """The named statements of a file, as written."""
    parts = _NAME_LINE.split(text)
    statements = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in statements:
            raise ValueError(f"duplicate statement name {name!r}")
        statements[name] = body
    return statements


def _tidy(body: str) -> str:
    return minify(body).rstrip(";").rstrip()


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
        return _INCLUDE.sub(include, statements[name])  # a fragment may include fragments

    return {name: _INCLUDE.sub(include, sql) for name, sql in statements.items() if not name.startswith("_")}


class Statements(Mapping[str, str]):
    """The statements of one schema. Each is minified, pointed at the schema and given its
    fragments when first used: a process uses a few of them (an enqueuer one or two), and
    preparing all of them up front would slow every process's start (tests/benchmarks/RESULTS.md,
    notes moved from code comments)."""

    def __init__(self, raw: dict[str, str], schema: str):
        self._raw, self._schema = raw, schema
        self._ready: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        sql = self._ready.get(name)
        if sql is None:
            if name.startswith("_") or name not in self._raw:
                raise KeyError(name)
            sql = self._ready[name] = expand({name: self._piece(name), **self._fragments(name)})[name]
        return sql

    def _piece(self, name: str) -> str:
        return qualify(_tidy(self._raw[name]), self._schema)

    def _fragments(self, name: str) -> dict[str, str]:
        """The fragments `name` includes, and those they include."""
        found: dict[str, str] = {}
        todo = set(_INCLUDE.findall(self._raw[name]))
        while todo:
            fragment = todo.pop()
            if fragment in found or fragment not in self._raw:
                continue
            found[fragment] = self._piece(fragment)
            todo.update(_INCLUDE.findall(self._raw[fragment]))
        return found

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._raw if not name.startswith("_"))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@functools.lru_cache(maxsize=None)
def load(schema: str = "skiplock") -> Statements:
    raw: dict[str, str] = {}
    for path in sorted((Path(__file__).parent / "sql").glob("*.sql")):
        for name, body in split(path.read_text(encoding="utf-8")).items():
            if name in raw:
                raise ValueError(f"statement {name!r} defined twice")
            raw[name] = body
    return Statements(raw, schema)

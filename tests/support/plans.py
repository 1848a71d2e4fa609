"""Query plans for tests: EXPLAIN of a statement psycopg prepared on a connection, and the nodes of
a JSON plan. Reads plans only; what a plan must look like is each test's to say."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg


def explain_prepared(conn: psycopg.Connection, params: dict, sql: str, options: str = "COSTS OFF"
                     ) -> tuple[object, int, int]:
    """EXPLAIN (`options`) the statement psycopg prepared on `conn` from `sql`, with `params`;
    returns (the plan: its text lines joined, or the parsed document with FORMAT JSON; generic
    plans, custom plans) as Postgres counted them before this EXPLAIN."""
    prepared = conn.execute("SELECT name, statement, generic_plans, custom_plans, parameter_types::text[] "
                            "FROM pg_prepared_statements").fetchall()
    # psycopg sends the text with %(name)s turned into $1, $2, ...
    pattern = re.escape(re.sub(r"%\((\w+)\)s", "\x00", sql).replace("%%", "%")).replace("\x00", r"\$\d+")
    rows = [row[:1] + row[2:] for row in prepared if re.fullmatch(pattern, row[1])]
    assert len(rows) == 1, rows
    name, generic, custom, types = rows[0]
    order: list[str] = []  # psycopg numbers the parameters in order of first use
    for found in re.finditer(r"%\((\w+)\)s", sql):
        if found.group(1) not in order:
            order.append(found.group(1))
    placeholders = ", ".join(f"%s::{t}" for t in types)
    # EXECUTE's arguments are not typed when EXPLAIN is parsed: bind them client-side
    rows = psycopg.ClientCursor(conn).execute(f"EXPLAIN ({options}) EXECUTE {name}({placeholders})",
                                              [params[n] for n in order]).fetchall()
    if "FORMAT JSON" in options.upper():
        return rows[0][0], generic, custom
    return "\n".join(r[0] for r in rows), generic, custom


def plan_nodes(document) -> Iterator[tuple[dict, tuple[dict, ...]]]:
    """Every node of an EXPLAIN (FORMAT JSON) document, depth first, with its ancestors (nearest
    last)."""
    def walk(node: dict, ancestors: tuple[dict, ...]):
        yield node, ancestors
        for child in node.get("Plans", ()):
            yield from walk(child, ancestors + (node,))

    yield from walk(document[0]["Plan"], ())

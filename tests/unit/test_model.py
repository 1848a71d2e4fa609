"""App-generated ids and the named-statement loader."""

from __future__ import annotations

import pytest

from skiplock.engine import queries
from skiplock.engine.model import uuid7


def test_uuid7_version_variant_and_order():
    ids = [uuid7() for _ in range(10_000)]
    assert all(u.version == 7 and u.variant == "specified in RFC 4122" for u in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_every_statement_loads_and_names_are_unique():
    statements = queries.load()
    for name in ("task_insert", "task_claim", "task_heartbeat", "task_settle", "task_reclaim_expired",
                 "task_cancel", "task_resume"):
        assert name in statements and statements[name].strip()


def test_schema_substitution():
    other = queries.load("tenant_a")
    assert "skiplock." not in other["task_claim"] and "tenant_a.tasks" in other["task_claim"]


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        queries.split("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_fragments_are_included_and_not_exposed():
    statements = queries.Statements(queries.split(
        "-- name: _ctes\na AS (SELECT 1)\n-- name: one\nWITH {{_ctes}} SELECT * FROM a;\n"), "skiplock")
    assert statements == {"one": "WITH a AS (SELECT 1) SELECT * FROM a"}
    with pytest.raises(ValueError, match="unknown SQL fragment"):
        queries.expand({"x": "{{_missing}}"})
    with pytest.raises(ValueError, match="unknown SQL fragment"):
        queries.Statements({"x": "SELECT {{_missing}}"}, "skiplock")["x"]


def test_minify_drops_comments_and_whitespace_but_not_literals():
    sql = "SELECT  'a  -- b', x -- why\n  FROM   t\n-- gone\nWHERE y IN ( 'it''s  ok' , 'z' ) AND a = b AND c >= d"
    assert queries.minify(sql) == "SELECT 'a  -- b',x FROM t WHERE y IN ('it''s  ok','z') AND a=b AND c >=d"
    assert queries.minify("payload->>'k' - 1 -- c\n") == "payload->>'k' - 1"  # a '-' is not a comment
    assert queries.minify("a\t\t,\n(b)") == "a,(b)"
    assert queries.minify("'unterminated  ") == "'unterminated"


def test_every_statement_fits_the_driver_cache():
    assert max(len(sql.encode()) for sql in queries.load().values()) <= 4096


def test_uuid7_many_continues_the_order():
    ids = [uuid7()] + uuid7.many(5000) + [uuid7()] + uuid7.many(3)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(u.version == 7 for u in ids)


def test_statements_are_prepared_on_first_use_and_fragments_stay_hidden():
    statements = queries.Statements(queries.split(
        "-- name: _ctes\na AS (SELECT 1 FROM skiplock.t)  -- why\n-- name: one\nWITH {{_ctes}}\nSELECT * FROM a;\n"
        "-- name: two\nSELECT   2;\n"), "tenant_b")
    assert list(statements) == ["one", "two"] and len(statements) == 2
    assert statements["one"] == "WITH a AS (SELECT 1 FROM tenant_b.t) SELECT * FROM a"
    assert statements["two"] == "SELECT 2"
    for hidden in ("_ctes", "three"):
        with pytest.raises(KeyError):
            statements[hidden]

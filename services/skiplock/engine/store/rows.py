"""Rows into row types (NamedTuples or dataclasses) by column name, with the column-to-field
match built once per statement and row type.

It runs no statement of its own: it reads the cursors the table groups ran.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import psycopg


def row_fields(row_type: type) -> tuple[str, ...]:
    """The fields of a row type (a NamedTuple or a dataclass), in order."""
    fields = getattr(row_type, "_fields", None)
    if fields is not None:
        return tuple(fields)
    return tuple(f.name for f in dataclasses.fields(row_type))


def _required(row_type: type) -> set[str]:
    defaults = getattr(row_type, "_field_defaults", None)
    if defaults is not None:
        return set(row_type._fields) - set(defaults)
    return {f.name for f in dataclasses.fields(row_type)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def row_maker(statement: str, row_type: type, columns: Sequence[str]) -> Callable[[tuple], Any]:
    """Build one row of `row_type` from one row of `statement`, matching columns to fields by
    name; raises TypeError naming the statement when they do not fit. Columns in the order of
    the fields (every statement today) are passed by position: no per-row cost over a tuple."""
    fields, columns = row_fields(row_type), tuple(columns)
    unknown = [c for c in columns if c not in fields]
    missing = _required(row_type) - set(columns)
    if unknown or missing or len(set(columns)) != len(columns):
        raise TypeError(f"statement {statement!r} returns columns {list(columns)}, which do not fill "
                        f"{row_type.__name__}{list(fields)}")
    if columns == fields[:len(columns)]:
        if columns == fields and hasattr(row_type, "_make"):
            return row_type._make
        return lambda row: row_type(*row)
    return lambda row: row_type(**dict(zip(columns, row)))


# {(statement, row type): maker}: built from the first result's description, then reused
_MAKERS: dict[tuple[str, type], Callable[[tuple], Any]] = {}


def rows_as(statement: str, row_type: type, cursor: psycopg.Cursor) -> list:
    """All rows of `cursor` (which ran `statement`) as `row_type`."""
    rows = cursor.fetchall()
    make = _MAKERS.get((statement, row_type))
    if make is None:
        make = _MAKERS[statement, row_type] = row_maker(statement, row_type,
                                                        [c.name for c in cursor.description])
    return list(map(make, rows))


# {(statement, row type, summary type): (the row type's column count, its maker, the summary's maker)}
_SPLIT_MAKERS: dict[tuple[str, type, type], tuple[int, Callable[[tuple], Any], Callable[[tuple], Any]]] = {}


def rows_and_summary(statement: str, row_type: type, summary_type: type, cursor: psycopg.Cursor) -> tuple[list, Any]:
    """The rows of `cursor` (which ran `statement`) as `row_type`, and its last row, the summary,
    as `summary_type`. Every row has `row_type`'s columns, then `summary_type`'s: a claim returns
    its tasks and what it saw in one result (the summary reads the statement's CTEs)."""
    rows = cursor.fetchall()
    makers = _SPLIT_MAKERS.get((statement, row_type, summary_type))
    if makers is None:
        columns = [c.name for c in cursor.description]
        n = len(columns) - len(row_fields(summary_type))
        make = row_maker(statement, row_type, columns[:n])
        if make is getattr(row_type, "_make", None):
            # every field, by position: the tuple is built in C, with no Python call per row
            # (_make's length check holds by construction: each row is cut to n columns)
            make = functools.partial(tuple.__new__, row_type)
        makers = _SPLIT_MAKERS[statement, row_type, summary_type] = (
            n, make, row_maker(statement, summary_type, columns[n:]))
    n, make, make_summary = makers
    summary = make_summary(rows.pop()[n:])
    return list(map(make, map(operator.itemgetter(slice(0, n)), rows))), summary

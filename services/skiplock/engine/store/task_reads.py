"""One task and its events, read on a caller's connection (sync or asyncio): what a framework's
result object is built from (skiplock.contrib.django's get_result).

On the caller's connection, so a read inside its transaction sees the tasks it enqueued and has
not committed yet. The cursor loads json and jsonb as JSON whatever loaders the connection's
owner registered (Django's backend registers a text loader for jsonb on its connections). It runs
the store's own statements (task_get, task_events_list) and writes nothing.
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import JsonbLoader, JsonLoader

from .. import queries
from ..model import Task, TaskEvent
from .rows import row_maker, rows_as
from .translation import translated_errors


def _json_cursor(cursor):
    cursor.adapters.register_loader("jsonb", JsonbLoader)
    cursor.adapters.register_loader("json", JsonLoader)
    return cursor


def task_with_events(conn: psycopg.Connection, schema: str, task_id: uuid.UUID) -> tuple[Task, list[TaskEvent]] | None:
    """The task of `task_id` and its events in order, or None when no task has that id."""
    statements = queries.load(schema)
    with translated_errors(conn), _json_cursor(conn.cursor()) as cur:
        tasks = rows_as("task_get", Task, cur.execute(statements["task_get"], {"id": task_id}))
        if not tasks:
            return None
        events = rows_as("task_events_list", TaskEvent, cur.execute(statements["task_events_list"], {"id": task_id}))
    return tasks[0], events


async def task_with_events_async(conn: psycopg.AsyncConnection, schema: str,
                                 task_id: uuid.UUID) -> tuple[Task, list[TaskEvent]] | None:
    """task_with_events, on an AsyncConnection."""
    statements = queries.load(schema)
    with translated_errors():
        async with _json_cursor(conn.cursor()) as cur:
            tasks = await _rows_as_async("task_get", Task, await cur.execute(statements["task_get"], {"id": task_id}))
            if not tasks:
                return None
            events = await _rows_as_async("task_events_list", TaskEvent,
                                          await cur.execute(statements["task_events_list"], {"id": task_id}))
    return tasks[0], events


async def _rows_as_async(statement: str, row_type: type, cursor: psycopg.AsyncCursor) -> list:
    make = row_maker(statement, row_type, [c.name for c in cursor.description])
    return [make(row) for row in await cursor.fetchall()]

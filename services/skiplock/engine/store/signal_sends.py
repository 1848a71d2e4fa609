"""skiplock.send_signal's write: the signal and the wake-up of the tasks waiting for it, in the
caller's transaction (or in one of its own on an idle autocommit connection), the same plan for
the sync and the async door (as enqueue's, engine/store/task_inserts.py).

Why a send takes the signal's lock before it writes: engine/sql/steps.sql, signal_lock.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from .. import queries
from ..errors import InvalidInput
from .connection import jsonb
from .task_inserts import Plan, _Query, _run, _run_async, _unit


class Sent(NamedTuple):
    """What a send did: `created` False when a signal of that name existed (it is unchanged);
    `woken`: tasks that were waiting for it and are queued now."""

    created: bool
    woken: int


def _send_plan(name: str, payload: Any, schema: str) -> Plan:
    sql = queries.load(schema)
    [(isolation, _)] = yield _Query(sql["signal_lock"], {"namespace": f"skiplock.signals {schema}", "name": name})
    if isolation != "read committed":
        raise InvalidInput(f"send_signal needs a READ COMMITTED transaction (this one is {isolation}): a "
                           "task suspending meanwhile would not be seen")
    [(created, woken)] = yield _Query(sql["signal_send"], {"name": name, "payload": jsonb(payload),
                                                           "channel": f"skiplock_{schema}"})
    return Sent(bool(created), int(woken))


def signal_send(conn: psycopg.Connection, name: str, payload: Any, schema: str) -> Sent:
    return _run(conn, _unit(_send_plan(name, payload, schema), one_statement=False))


async def signal_send_async(conn: psycopg.AsyncConnection, name: str, payload: Any, schema: str) -> Sent:
    return await _run_async(conn, _unit(_send_plan(name, payload, schema), one_statement=False))

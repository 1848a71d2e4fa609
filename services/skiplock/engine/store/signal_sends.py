"""skiplock.send_signal's write: the signal and the wake-up of the tasks waiting for it, in the
caller's transaction (or in one of its own on an idle autocommit connection), the same plan for
the sync and the async door (as enqueue's, engine/store/task_inserts.py).

Why a send takes the signal's lock before it writes: engine/sql/steps.sql, signal_lock.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from .. import queries
from ..errors import InvalidInput
from .connection import jsonb
from .routed import outbox_params
from .task_inserts import Plan, _Query, _run, _run_async, _unit, placement_plan


class Sent(NamedTuple):
    """What a send did: `created` False when a signal of that name existed (it is unchanged);
    `woken`: tasks that were waiting for it and are queued now."""

    created: bool
    woken: int


def _send_plan(conn, name: str, payload: Any, schema: str) -> Plan:
    sql = queries.load(schema)
    distributed = yield from placement_plan(conn, schema)
    [(isolation, _)] = yield _Query(sql["signal_lock"], {"namespace": f"skiplock.signals {schema}", "name": name})
    if isolation != "read committed":
        raise InvalidInput(f"send_signal needs a READ COMMITTED transaction (this one is {isolation}): a "
                           "task suspending meanwhile would not be seen")
    if distributed:
        return (yield from _routed_send_plan(sql, name, payload, schema))
    [(created, woken)] = yield _Query(sql["signal_send"], {"name": name, "payload": jsonb(payload),
                                                           "channel": f"skiplock_{schema}"})
    return Sent(bool(created), int(woken))


def _routed_send_plan(sql, name: str, payload: Any, schema: str) -> Plan:
    """signal_send on the distributed placement (store/routed.py): the signal on the reference
    table, then the tasks waiting for it, read from every shard, queued queue by queue with their
    events, outbox and wake-up."""
    created = yield _Query(sql["routed_signal_insert"], {"name": name, "payload": jsonb(payload)})
    waiters = yield _Query(sql["routed_signal_waiters"], {"name": name})
    woken: list[str] = []
    if waiters:
        [(now, outbox)] = yield _Query(sql["routed_now"], {})
        for queue in sorted({q for q, _ in waiters}):
            rows = yield _Query(sql["routed_signal_wake"], {
                "queue": queue, "ids": sorted(i for q, i in waiters if q == queue), "name": name, "now": now})
            if not rows:
                continue
            events = [{"id": task_id.hex, "seq": seq, "type": "queued", "attempt": attempts,
                       "data": {"reason": "signal", "signal": name}} for task_id, seq, attempts in rows]
            yield _Query(sql["routed_task_events"], {"queue": queue, "events": Jsonb(events)})
            if outbox:
                yield _Query(sql["routed_outbox"], outbox_params([queue], [(r[0], r[1]) for r in rows]))
            woken += [queue] * len(rows)
        if woken:
            yield _Query(sql["routed_wake"], {"channel": f"skiplock_{schema}", "queues": sorted(set(woken))})
    return Sent(bool(created), len(woken))


def signal_send(conn: psycopg.Connection, name: str, payload: Any, schema: str) -> Sent:
    return _run(conn, _unit(_send_plan(conn, name, payload, schema), one_statement=False))


async def signal_send_async(conn: psycopg.AsyncConnection, name: str, payload: Any, schema: str) -> Sent:
    return await _run_async(conn, _unit(_send_plan(conn, name, payload, schema), one_statement=False))

"""`skiplock.send_signal` and its asyncio twin `send_signal_async`: wake the tasks waiting for a
signal (ctx.wait_for_signal).

Given a psycopg connection, the signal is written inside the caller's current transaction, like
enqueue: it exists, and the tasks waiting for it are queued, if and only if that commits. Given
a URL, a short connection is opened and the signal committed before returning. The first send
of a name wins: a second one changes nothing and says so (Sent.created is False).
"""

from __future__ import annotations

from typing import Any

from .engine import store as store_mod
from .engine.durable import check_name, encode_json
from .engine.errors import InvalidInput
from .engine.store import AsyncConnection, Connection
from .engine.store.signal_sends import Sent, signal_send, signal_send_async
from .enqueueing import _max_payload, _pooler, _schema


def _checked(name: Any, payload: Any) -> Any:
    check_name("signal", name)
    return encode_json("signal payload", payload, _max_payload())[1]


def send_signal(conn_or_url: Connection | str, name: str, payload: Any = None, *,
                schema: str | None = None) -> Sent:
    """Send the signal `name` with a JSON `payload`; returns Sent(created, woken)."""
    schema = _schema(schema)
    payload = _checked(name, payload)
    if isinstance(conn_or_url, Connection):
        return signal_send(conn_or_url, name, payload, schema)
    if isinstance(conn_or_url, AsyncConnection):
        raise InvalidInput("send_signal got a psycopg AsyncConnection: use `await skiplock.send_signal_async(...)`")
    if not isinstance(conn_or_url, str):
        raise InvalidInput("send_signal needs a psycopg Connection or a postgresql:// URL")
    with store_mod.connect(conn_or_url, autocommit=True, pooler=_pooler()) as conn:
        return signal_send(conn, name, payload, schema)


async def send_signal_async(conn_or_url: AsyncConnection | str, name: str, payload: Any = None, *,
                            schema: str | None = None) -> Sent:
    """send_signal, for asyncio: a psycopg AsyncConnection (inside its transaction) or a URL."""
    schema = _schema(schema)
    payload = _checked(name, payload)
    if isinstance(conn_or_url, AsyncConnection):
        return await signal_send_async(conn_or_url, name, payload, schema)
    if isinstance(conn_or_url, Connection):
        raise InvalidInput("send_signal_async got a psycopg Connection: use `skiplock.send_signal(...)`")
    if not isinstance(conn_or_url, str):
        raise InvalidInput("send_signal_async needs a psycopg AsyncConnection or a postgresql:// URL")
    async with await store_mod.connect_async(conn_or_url, autocommit=True, pooler=_pooler()) as conn:
        return await signal_send_async(conn, name, payload, schema)

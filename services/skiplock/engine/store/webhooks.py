"""Webhook endpoints, their deliveries and the outbox: one method per statement of
engine/sql/webhooks.sql, named after it.

Whether an endpoint is disabled after failures, and when a delivery is retried, is the
dispatcher's decision; these methods run the statements and keep the outbox trigger in step
with the endpoints (it exists only while one is enabled).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from ..errors import DatabaseUnavailable, DeliveryNotFound, InvalidInput, WebhookNotFound
from ..model import uuid7
from .database import Database
from .rows import rows_as
from .tasks import parse_uuid


class WebhookEndpoint(NamedTuple):
    id: uuid.UUID
    url: str
    event_types: list[str]
    description: str | None
    enabled: bool
    disabled_reason: str | None
    created_at: dt.datetime
    pending: int
    dead: int


class Delivery(NamedTuple):
    """A claimed delivery attempt: what the dispatcher needs to send it and fence its outcome."""

    id: uuid.UUID
    event_id: uuid.UUID
    endpoint_id: uuid.UUID
    url: str
    secret: str
    event_type: str
    payload: Any
    attempts: int  # attempts made before this one
    lease_token: int
    created_at: dt.datetime
    trace_context: Any = None  # the task's W3C trace context (engine/tracing.py), or None


class DeliveryRecord(NamedTuple):
    id: uuid.UUID
    event_id: uuid.UUID
    endpoint_id: uuid.UUID
    event_type: str
    payload: Any
    state: str
    attempts: int
    next_attempt_at: dt.datetime
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    delivered_at: dt.datetime | None


def _webhook_id(endpoint_id: uuid.UUID | str) -> uuid.UUID:
    return parse_uuid(endpoint_id, WebhookNotFound, "webhook")


class WebhookStore:
    """Queries of the webhook_endpoints and webhook_deliveries tables."""

    def __init__(self, db: Database):
        self.db = db

    def _sync_outbox_trigger(self, conn: psycopg.Connection) -> None:
        """Fan-out costs nothing while no endpoint is enabled: the trigger does not exist then.
        Called under webhook_endpoints_lock, after the change, in the same transaction. On the
        distributed placement there is no trigger: the routed statements write the outbox
        (routed_outbox) while an endpoint is enabled."""
        if self.db.distributed:
            return
        sql = self.db.sql
        wanted = conn.execute(sql["webhook_endpoints_any_enabled"]).fetchone()[0]
        if conn.execute(sql["outbox_trigger_enabled"]).fetchone()[0] == wanted:
            return  # most changes switch nothing: take no lock on task_events
        conn.execute(sql["outbox_trigger_lock_timeout"])
        try:
            conn.execute(sql["outbox_trigger_drop"])  # one disabled by hand, too
            if wanted:
                conn.execute(sql["outbox_trigger_create"])
        except psycopg.errors.LockNotAvailable as exc:
            raise DatabaseUnavailable("could not switch the webhook outbox trigger: task_events is locked by a "
                                      "long transaction; try again") from exc

    # -- endpoints
    def webhook_endpoint_insert(self, url: str, event_types: Sequence[str], secret: str,
                                description: str | None = None) -> WebhookEndpoint:
        endpoint_id = uuid7()
        with self.db.unit() as conn:
            conn.execute(self.db.sql["webhook_endpoints_lock"])
            conn.execute(self.db.sql["webhook_endpoint_insert"], dict(
                id=endpoint_id, url=url, secret=secret, event_types=list(event_types), description=description))
            self._sync_outbox_trigger(conn)
        return self.webhook_endpoint_get(endpoint_id)

    def webhook_endpoint_list(self) -> list[WebhookEndpoint]:
        return self.db.fetch_as("webhook_endpoint_list", {}, WebhookEndpoint)

    def webhook_endpoint_get(self, endpoint_id: uuid.UUID | str) -> WebhookEndpoint:
        found = self.db.fetch_as("webhook_endpoint_get", {"id": _webhook_id(endpoint_id)}, WebhookEndpoint)
        if not found:
            raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")
        return found[0]

    def webhook_endpoint_delete(self, endpoint_id: uuid.UUID | str) -> None:
        """Deletes the endpoint and its deliveries (pending ones are not sent)."""
        key = _webhook_id(endpoint_id)
        with self.db.unit() as conn:
            conn.execute(self.db.sql["webhook_endpoints_lock"])
            if not conn.execute(self.db.sql["webhook_endpoint_delete"], {"id": key}).fetchall():
                raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")
            self._sync_outbox_trigger(conn)

    def webhook_endpoint_set_secret(self, endpoint_id: uuid.UUID | str, secret: str) -> None:
        if not self.db.fetch("webhook_endpoint_set_secret", {"id": _webhook_id(endpoint_id), "secret": secret}):
            raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")

    def webhook_endpoint_disable_dying(self, endpoint_ids: list, window_seconds: float) -> list[tuple]:
        """Disable those of `endpoint_ids` whose deliveries have only died for `window_seconds`, each
        with its reason and its audit row (`webhook.disable`, actor `dispatcher`), in one
        transaction; [(id, url, reason)] of those disabled."""
        with self.db.unit() as conn:
            conn.execute(self.db.sql["webhook_endpoints_lock"])
            disabled = conn.execute(self.db.sql["webhook_endpoint_disable_dying"], dict(
                endpoint_ids=[_webhook_id(e) for e in endpoint_ids], window=window_seconds)).fetchall()
            for endpoint_id, _, reason in disabled:
                conn.execute(self.db.sql["audit_insert"], dict(
                    actor="dispatcher", action="webhook.disable", target=str(endpoint_id), request_id=None,
                    outcome="ok", detail=Jsonb({"reason": reason})))
            if disabled:
                self._sync_outbox_trigger(conn)
        return disabled

    def webhook_endpoint_set_enabled(self, endpoint_id: uuid.UUID | str, enabled: bool,
                                     reason: str | None = None) -> None:
        key = _webhook_id(endpoint_id)
        with self.db.unit() as conn:
            conn.execute(self.db.sql["webhook_endpoints_lock"])
            if not conn.execute(self.db.sql["webhook_endpoint_set_enabled"], dict(
                    id=key, enabled=enabled, reason=None if enabled else reason)).fetchall():
                raise WebhookNotFound(f"webhook endpoint {endpoint_id} not found")
            self._sync_outbox_trigger(conn)

    # -- deliveries
    def webhook_delivery_claim(self, limit: int, owner: str, lease_seconds: float) -> list[Delivery]:
        params = dict(limit=limit, owner=owner, lease_seconds=lease_seconds)
        if not self.db.distributed:
            return self.db.fetch_as("webhook_delivery_claim", params, Delivery)
        # the distributed placement: nextval() is refused in an UPDATE of a table Citus holds
        with self.db.connection() as conn, conn.transaction():
            ids = [i for (i,) in conn.execute(self.db.sql["routed_delivery_pick"], params).fetchall()]
            if not ids:
                return []
            tokens = [t for (t,) in conn.execute(self.db.sql["routed_lease_tokens"], dict(limit=len(ids))).fetchall()]
            leased = rows_as("routed_delivery_lease", Delivery, conn.execute(
                self.db.sql["routed_delivery_lease"], dict(params, ids=ids, tokens=tokens)))
            # the tasks' trace contexts, read on their queues' shards (the payload names both)
            tasks = {d.payload["data"]["task_id"]: d.payload["data"]["queue"] for d in leased}
            traced = dict(conn.execute(self.db.sql["routed_trace_contexts"], dict(
                queues=sorted(set(tasks.values())), ids=sorted(tasks))).fetchall())
            return [d._replace(trace_context=traced.get(uuid.UUID(d.payload["data"]["task_id"]))) for d in leased]

    def webhook_delivery_settle(self, outcomes: Sequence[dict]) -> dict[uuid.UUID, str]:
        """Fenced outcomes [{id, token, outcome, status, error, delay}]; returns {id: new state}
        for those applied (a missing id lost its lease)."""
        if not outcomes:
            return {}
        rows = [{k: (str(v) if k == "id" else v) for k, v in o.items() if v is not None} for o in outcomes]
        return dict(self.db.fetch("webhook_delivery_settle", {"outcomes": Jsonb(rows)}))

    def webhook_delivery_heartbeat(self, leases: Sequence[tuple[uuid.UUID, int]],
                                   lease_seconds: float) -> set[uuid.UUID]:
        if not leases:
            return set()
        rows = self.db.fetch("webhook_delivery_heartbeat", dict(
            ids=[i for i, _ in leases], tokens=[t for _, t in leases], lease_seconds=lease_seconds))
        return {r[0] for r in rows}

    def webhook_delivery_list(self, *, state: str | None = None, endpoint_id: uuid.UUID | str | None = None,
                              after: uuid.UUID | str | None = None, limit: int = 100) -> list[DeliveryRecord]:
        return self.db.fetch_as("webhook_delivery_list", dict(
            state=state, limit=limit,
            endpoint_id=None if endpoint_id is None else _webhook_id(endpoint_id),
            after=None if after is None else parse_uuid(after, InvalidInput, "cursor")), DeliveryRecord)

    def webhook_delivery_list_newest(self, *, state: str | None = None, endpoint_id: uuid.UUID | str | None = None,
                                     limit: int = 100) -> list[DeliveryRecord]:
        """The latest `limit` deliveries, newest first."""
        return self.db.fetch_as("webhook_delivery_list_newest", dict(
            state=state, limit=limit, endpoint_id=None if endpoint_id is None else _webhook_id(endpoint_id)),
            DeliveryRecord)

    def webhook_delivery_get(self, delivery_id: uuid.UUID | str) -> DeliveryRecord:
        rows = self.db.fetch_as("webhook_delivery_get",
                                {"id": parse_uuid(delivery_id, DeliveryNotFound, "delivery")}, DeliveryRecord)
        if not rows:
            raise DeliveryNotFound(f"delivery {delivery_id} not found")
        return rows[0]

    def webhook_delivery_redeliver(self, *, delivery_id: uuid.UUID | str | None = None,
                                   endpoint_id: uuid.UUID | str | None = None) -> int:
        """Dead deliveries back to pending, with a fresh attempt budget: one, or all of an endpoint."""
        params = dict(id=None, endpoint_id=None)
        if delivery_id is not None:
            params["id"] = parse_uuid(delivery_id, DeliveryNotFound, "delivery")
        elif endpoint_id is not None:
            params["endpoint_id"] = _webhook_id(endpoint_id)
        else:
            raise InvalidInput("redeliver: give a delivery id or an endpoint id")
        return len(self.db.fetch("webhook_delivery_redeliver", params))

    def outbox_stats(self) -> tuple[int, float]:
        """(deliveries pending or in flight, age in seconds of the oldest of them)."""
        count, age = self.db.fetch("outbox_stats", {})[0]
        return count, age

    def webhook_delivery_delete_old(self, state: str, older_than_seconds: float, limit: int = 500) -> int:
        return len(self.db.fetch("webhook_delivery_delete_old", dict(state=state, older_than=older_than_seconds,
                                                                     limit=limit)))

"""The worker registry (the skiplock.workers table): one method per statement of
engine/sql/workers.sql, named after it.

When a row is stale is the scheduler's decision (scheduler/maintenance.py passes it in).
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from .database import Database


class WorkerRecord(NamedTuple):
    """A row of the worker registry: a worker as it registered itself, and its last heartbeat."""

    id: str  # the lease_owner of its claims
    host: str  # SKIPLOCK_POD_NAME, else the host name
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    version: str
    lease_seconds: float
    started_at: dt.datetime | None = None  # the database's clock; None before it registered
    heartbeat_at: dt.datetime | None = None
    heartbeat_age_seconds: float | None = None


class WorkerStore:
    """Queries of the workers table."""

    def __init__(self, db: Database):
        self.db = db

    def worker_register(self, record: WorkerRecord) -> bool:
        """Insert a worker's row, or renew its heartbeat and in_flight. True when it inserted."""
        return self.db.fetch("worker_register", dict(
            id=record.id, host=record.host, pid=record.pid, queues=list(record.queues),
            concurrency=record.concurrency, in_flight=record.in_flight, version=record.version,
            lease_seconds=record.lease_seconds))[0][0]

    def worker_delete(self, worker_id: str, timeout: float | None = None) -> bool:
        """A clean exit; False when the row was already gone. `timeout`: the longest wait for a
        connection (default the pool's)."""
        return bool(self.db.fetch("worker_delete", {"id": worker_id}, timeout=timeout))

    def worker_delete_stale(self, leases: float) -> list[tuple[str, str, int]]:
        """Rows whose heartbeat is older than `leases` of their own leases: [(id, host, pid)]."""
        return [tuple(r) for r in self.db.fetch("worker_delete_stale", {"leases": leases})]

    def worker_list(self) -> list[WorkerRecord]:
        return self.db.fetch_as("worker_list", {}, WorkerRecord)

    def worker_queue_counts(self) -> list[tuple[str, int, int]]:
        """[(queue, workers claiming from it, the sum of their concurrency)]."""
        return [tuple(r) for r in self.db.fetch("worker_queue_counts", {})]

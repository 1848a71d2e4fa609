"""This worker's row in the worker registry (skiplock.workers): who it is, where it runs, what it
claims from, how busy it is, and when it last beat.

The keeper thread calls `beat()` on the heartbeat's period (the first time as the worker starts),
and shutdown calls `remove()` once the worker has drained and the keeper has stopped. Neither may
run on the claim or settle path. Operators read the registry; no claim or outcome depends on it,
so the worker logs a failed beat and goes on (the next beat inserts or renews the row).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

from ..engine.settings import WorkerSettings
from ..engine.store import Store, WorkerRecord
from ..engine.version import package_version

log = logging.getLogger("skiplock.worker.registration")


class Registration:
    """Owns this worker's row: what it registers, and how many beats reached the table."""

    def __init__(self, store: Store, settings: WorkerSettings, worker_id: str, queues: Sequence[str],
                 concurrency: int, lease_seconds: float):
        self.store = store
        self.record = WorkerRecord(id=worker_id, host=settings.pod_name or socket.gethostname(),
                                   pid=os.getpid(), queues=list(queues), concurrency=concurrency,
                                   in_flight=0, version=package_version(), lease_seconds=lease_seconds)
        self.beats = 0

    def beat(self, in_flight: int) -> None:
        """Insert or renew the row with the in-flight count (one statement); raises on database
        trouble."""
        inserted = self.store.workers.worker_register(self.record._replace(in_flight=in_flight))
        if inserted and self.beats:
            # the maintenance deleted the row: this worker missed its beats for three leases
            log.warning("worker registered again after its row was removed", extra={"worker": self.record.id})
        self.beats += 1

    def remove(self, timeout: float | None = None) -> None:
        """A clean exit: delete the row, waiting at most `timeout` for a connection; raises on
        database trouble (the maintenance deletes it three leases later)."""
        self.store.workers.worker_delete(self.record.id, timeout=timeout)

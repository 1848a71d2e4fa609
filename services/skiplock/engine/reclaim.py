"""The reclaim service: tasks whose lease expired go back to `queued` (or to `failed` past their
reclaim budget), and `cancelling` ones to `cancelled`.

The scheduler runs it every SKIPLOCK_REAPER_SECONDS, and workers run it too as a fallback
(worker/keeper.py, Keeper.reclaim_once) for installations without a scheduler: it lives in the
engine so that neither role imports the other. Safe in every replica at once: the statement locks
the rows it changes with SKIP LOCKED.
"""

from __future__ import annotations

import logging

from .logs import log_task_failed
from .metrics import Metrics
from .store import Store

log = logging.getLogger("skiplock.maintenance")  # the logger's name is what operators filter on

# rows per statement: small batches keep each transaction's locks short
BATCH = 500
# batches per run_once, so one run never monopolizes a replica; the next run continues
MAX_BATCHES = 20


class Reclaimer:
    """Expired leases back to `queued` (reclaims + 1), or to `failed` past the budget;
    `cancelling` with an expired lease to `cancelled`."""

    def __init__(self, store: Store, metrics: Metrics, max_reclaims: int):
        self.store, self.metrics, self.max_reclaims = store, metrics, max_reclaims

    def run_once(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _ in range(MAX_BATCHES):
            rows = self.store.tasks.task_reclaim_expired(self.max_reclaims, limit=BATCH)
            for row in rows:
                counts[row.state] = counts.get(row.state, 0) + 1
                if row.state in ("queued", "failed"):
                    self.metrics.task_reclaims.labels(row.queue).inc()
                if row.state == "failed":
                    log_task_failed(log, task_id=row.id, kind=row.kind, queue=row.queue,
                                    attempts=row.attempts, error=row.error)
            if len(rows) < BATCH:
                break
        if counts:
            log.info("reclaimed expired leases", extra={"counts": counts})
        return counts

"""Firing schedules: one `run_once()` is one tick, one transaction (see Store.fire_due_schedules).

Safe in every replica at once: due rows are locked with SKIP LOCKED, so each nominal time is
decided by exactly one tick, and its task's idempotency key makes even a repeated decision
produce no second task. The decisions themselves are pure (engine/schedules.plan_tick).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from ..engine.metrics import Metrics
from ..engine.schedules import plan_tick
from ..engine.store import Store

log = logging.getLogger("skiplock.scheduler")


@dataclasses.dataclass
class TickCounts:
    schedules: int = 0
    fired: int = 0
    skipped: int = 0
    buffered: int = 0
    missed: int = 0


class Firer:
    def __init__(self, store: Store, metrics: Metrics | None = None, *, max_payload_bytes: int = 1024 * 1024,
                 batch: int = 50):
        self.store, self.metrics = store, metrics or Metrics()
        self.max_payload_bytes, self.batch = max_payload_bytes, batch

    @staticmethod
    def _decide(schedule, state, now):
        return plan_tick(schedule, next_fire_at=state["next_fire_at"],
                         buffered_fire_at=state["buffered_fire_at"],
                         previous_state=state["previous_state"], now=now)

    def run_once(self, now: dt.datetime | None = None) -> TickCounts:
        """Fire what is due. `now` pins the database clock (tests walking across DST)."""
        results = self.store.fire_due_schedules(self._decide, now=now, limit=self.batch,
                                                max_payload_bytes=self.max_payload_bytes)
        counts = TickCounts(schedules=len(results))
        for r in results:
            counts.fired += len(r.fired)
            if r.fired:
                self.metrics.schedule_fires.labels(r.name).inc(len(r.fired))
                self.metrics.schedule_lag.labels(r.name).set((r.now - r.fired[-1][0]).total_seconds())
                log.info("schedule fired", extra={
                    "schedule": r.name, "fires": len(r.fired), "nominal_at": r.fired[-1][0].isoformat(),
                    "task_id": str(r.fired[-1][1]), "next_fire_at": r.next_fire_at.isoformat()})
            for nominal_at, outcome, detail in r.records:
                if outcome == "skipped":
                    counts.skipped += 1
                    self.metrics.schedule_skips.labels(r.name, "overlap").inc()
                elif outcome == "buffered":
                    counts.buffered += 1
                elif outcome == "missed":
                    counts.missed += 1
                    self.metrics.schedule_skips.labels(r.name, "catchup").inc()
                log.log(logging.INFO if outcome == "missed" else logging.DEBUG, f"schedule {outcome}", extra={"schedule": r.name, "nominal_at": nominal_at.isoformat(),
                                                       "detail": detail})
        return counts

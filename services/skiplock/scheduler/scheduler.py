"""The scheduler role's loop: fire due schedules on time, and run the maintenance services on
their intervals. Every replica runs the same loop; none assumes it is the only one.

Between units of work it sleeps until the soonest of: the next nominal fire time (read from the
database), the next maintenance run, or the poll interval (which also notices new schedules).
A signal only sets `stop`; the unit in progress finishes (each is one short transaction).
"""

from __future__ import annotations

import logging
import random
import time

from ..engine.errors import DatabaseUnavailable, MigrationError
from ..engine.lifecycle import Stop
from ..engine.metrics import Metrics
from ..engine.reclaim import Reclaimer
from ..engine.wake import WAKE_SECONDS, Waker
from ..engine.retry import failures_after
from ..engine.settings import SchedulerSettings, Settings
from ..engine.store import Store
from .firing import Firer
from .maintenance import LimitUpkeep, QueueGauges, Retention, StaleWorkers, WorkerGauges

log = logging.getLogger("skiplock.scheduler")

# never spin: even an overdue schedule waits this long between ticks that fired nothing
MIN_SLEEP = 0.005
MAX_BACKOFF = 10.0


class Scheduler:
    def __init__(self, settings: Settings | SchedulerSettings, store: Store, metrics: Metrics | None = None,
                 stop: Stop | None = None):
        # the scheduler's variables, and no other (engine/settings: each Variable names its roles)
        self.settings = settings = SchedulerSettings.of(settings)
        self.store = store
        self.metrics = metrics or Metrics()
        self.stop = stop or Stop()
        self.firer = Firer(store, self.metrics, max_payload_bytes=settings.max_payload_bytes)
        retain = {"completed": settings.retain_completed_seconds, "failed": settings.retain_failed_seconds,
                  "cancelled": settings.retain_cancelled_seconds}
        self.retention = Retention(store, self.metrics, retain, settings.retain_audit_seconds,
                                   settings.retain_signals_seconds)
        # (name, service, interval); the first run of each is spread so replicas do not align
        self.services = [
            ("reclaim", Reclaimer(store, self.metrics, settings.max_reclaims).run_once, settings.reclaim_seconds),
            ("wake", Waker(store).run_once, WAKE_SECONDS),
            ("gauges", QueueGauges(store, self.metrics).run_once, settings.gauges_seconds),
            ("retention", self.retention.run_once, settings.retention_seconds),
            ("stale_workers", StaleWorkers(store, self.metrics).run_once, settings.reclaim_seconds),
            ("worker_gauges", WorkerGauges(store, self.metrics).run_once, settings.gauges_seconds),
            ("limits", LimitUpkeep(store, self.metrics).run_once, settings.reclaim_seconds),
        ]
        now = time.monotonic()
        self._next_run = {name: now + random.uniform(0, min(interval, 1.0)) for name, _, interval in self.services}
        self._healthy = False
        self._failures = 0

    def ready(self) -> bool:
        return self._healthy and not self.stop.is_set()

    def run(self) -> int:
        log.info("scheduler started", extra={"poll_seconds": self.settings.poll_seconds})
        while not self.stop.is_set():
            try:
                sleep = self.run_once()
            except (DatabaseUnavailable, MigrationError) as exc:
                self._healthy = False
                self._failures = failures_after(self._failures, exc)
                sleep = random.uniform(0, min(MAX_BACKOFF, 0.5 * 2 ** self._failures))
                log.warning("database unavailable; retrying", extra={
                    "error": " ".join(str(exc).split())[:300], "retry_in": round(sleep, 2)})
            self.stop.wait(sleep)
        log.info("scheduler stopped")
        return 0

    def run_once(self) -> float:
        """Fire due schedules and run the maintenance services that are due; return how long
        to sleep before the next unit of work."""
        counts = self.firer.run_once()
        for name, service, interval in self.services:
            if self.stop.is_set():
                break
            if time.monotonic() >= self._next_run[name]:
                self._next_run[name] = time.monotonic() + interval
                service()
                if name == "retention" and self.retention.behind:
                    # it stopped at its time budget with rows still due: again after the next fires
                    self._next_run[name] = time.monotonic()
        self._healthy, self._failures = True, 0
        if counts.schedules:
            return 0.0  # more may be due (a catch-up batch, another page of due rows)
        until_fire = self.store.schedules.schedule_next_due()
        until_service = min(self._next_run.values()) - time.monotonic()
        candidates = [self.settings.poll_seconds, until_service]
        if until_fire is not None:
            candidates.append(until_fire)
        return max(MIN_SLEEP, min(candidates))

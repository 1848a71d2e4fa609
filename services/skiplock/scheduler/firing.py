"""Firing schedules: one `run_once()` is one tick, in one transaction: lock the due schedule
rows (skipping those another replica holds), plan each (engine/schedules.plan_tick, pure), then
enqueue the fires, record every decision and advance the rows. A crash anywhere rolls it all back.

Safe in every replica at once: due rows are locked with SKIP LOCKED, so each nominal time is
decided by exactly one tick, and its task's idempotency key makes even a repeated decision
produce no second task.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import uuid
from typing import NamedTuple

from ..engine import tracing
from ..engine.errors import InvalidInput, TaskNotCancellable, TaskNotFound
from ..engine.metrics import Metrics
from ..engine.model import TaskSpec
from ..engine.schedules import TickPlan, idempotency_key, plan_tick
from ..engine.store import DueSchedule, Store

log = logging.getLogger("skiplock.scheduler")


@dataclasses.dataclass
class TickCounts:
    schedules: int = 0
    fired: int = 0
    skipped: int = 0
    buffered: int = 0
    missed: int = 0


class FiredSchedule(NamedTuple):
    """What a tick did to one schedule."""

    name: str
    now: dt.datetime
    fired: list[tuple[dt.datetime, uuid.UUID]]  # (nominal time, task id)
    records: list[tuple[dt.datetime, str, str | None]]  # skipped / buffered / missed decisions
    next_fire_at: dt.datetime


class Firer:
    def __init__(self, store: Store, metrics: Metrics | None = None, *, max_payload_bytes: int = 1024 * 1024,
                 batch: int = 50):
        self.store, self.metrics = store, metrics or Metrics()
        self.max_payload_bytes, self.batch = max_payload_bytes, batch

    def tick(self, now: dt.datetime | None = None) -> list[FiredSchedule]:
        """One tick, one transaction; `now` pins the database's clock for tests."""
        results = []
        with self.store.transaction() as tx:
            now = tx.schedules.schedule_now(now)
            for due in tx.schedules.schedule_claim_due(now, self.batch):
                try:
                    # a savepoint per schedule: one that cannot fire leaves the others' fires intact
                    with tx.transaction() as sp:
                        plan = plan_tick(due.schedule(), next_fire_at=due.next_fire_at,
                                         buffered_fire_at=due.buffered_fire_at,
                                         previous_state=due.previous_state, now=now)
                        results.append(self._apply(sp, due, plan, now))
                except InvalidInput as exc:
                    # edited in the table by hand, a time zone this tzdata lacks, a payload over
                    # SKIPLOCK_MAX_PAYLOAD_BYTES: logged and looked at again in a minute, instead of
                    # failing every other schedule's tick
                    log.error("schedule cannot fire; retried in a minute",
                              extra={"schedule": due.name, "error": str(exc)})
                    tx.schedules.schedule_postpone(due.name, now)
        return results

    def _apply(self, tx: Store, due: DueSchedule, plan: TickPlan, now: dt.datetime) -> FiredSchedule:
        schedule = due.schedule()
        previous = due.last_task_id
        fired = []
        template = TaskSpec(schedule.kind, schedule.payload, queue=schedule.queue, priority=schedule.priority,
                            max_attempts=schedule.max_attempts, max_payload_bytes=self.max_payload_bytes)
        nominal_ats, outcomes, task_ids, details = [], [], [], []
        for fire in plan.fires:
            if fire.cancel_previous and previous is not None:
                try:
                    tx.tasks.task_cancel(previous, {"reason": f"schedule {schedule.name} fired again "
                                                              "(overlap cancel_previous)"})
                except (TaskNotCancellable, TaskNotFound):
                    pass  # it finished (or retention deleted it) since the plan was made
            spec = template.with_payload(schedule.payload, idempotency_key(schedule.name, fire.nominal_at))
            if schedule.jitter_seconds:
                spec.delay = random.uniform(0, schedule.jitter_seconds)
            # each fire is a trace of its own (None unless a tracer provider is set)
            with tracing.schedule_fire(schedule.name, schedule.queue, fire.nominal_at) as traced:
                spec.trace_context = traced.carrier
                [previous] = tx.tasks.task_insert([spec])
                traced.created(previous)
            fired.append((fire.nominal_at, previous))
            nominal_ats.append(fire.nominal_at), outcomes.append("fired")
            task_ids.append(previous), details.append(fire.detail)
        for nominal_at, outcome, detail in plan.records:
            nominal_ats.append(nominal_at), outcomes.append(outcome), task_ids.append(None), details.append(detail)
        if nominal_ats:
            tx.schedules.schedule_fire_record(schedule.name, nominal_ats, outcomes, task_ids, details)
        tx.schedules.schedule_advance(schedule.name, next_fire_at=plan.next_fire_at,
                                      buffered_fire_at=plan.buffered_fire_at,
                                      last_fire_at=fired[-1][0] if fired else None,
                                      last_task_id=previous if fired else None,
                                      fires=len(fired), skips=plan.skips)
        return FiredSchedule(schedule.name, now, fired, plan.records, plan.next_fire_at)

    def run_once(self, now: dt.datetime | None = None) -> TickCounts:
        """Fire what is due. `now` pins the database clock (tests walking across DST)."""
        results = self.tick(now)
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

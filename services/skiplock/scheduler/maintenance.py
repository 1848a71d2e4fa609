"""The maintenance services the scheduler runs besides the reclaimer (engine/reclaim.py, which
workers run too): retention, the queue gauges, flow control's upkeep, and the worker registry's
removal of dead workers and its gauges.

Each has `run_once()` returning what it did, and is safe to run in every replica at once:
retention locks the rows it changes with SKIP LOCKED; the gauges only read.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from ..engine.durable import SUSPENDED_REASONS
from ..engine.metrics import Metrics
from ..engine.model import STATES
from ..engine.store import Store

log = logging.getLogger("skiplock.maintenance")

# rows per statement: small batches keep each transaction's locks short
BATCH = 500
# how long one retention run deletes before it lets the scheduler fire what is due
RUN_SECONDS = 1.0


class Retention:
    """Deletes finished tasks (with their events and steps) past their state's retention, old
    schedule decisions, old webhook deliveries, old signals and old audit rows, in batches.

    A run deletes batch after batch, one from each kind of row in turn, until every kind is caught
    up (a batch came back short) or RUN_SECONDS have passed. Then `behind` says whether rows were
    still due, and the scheduler runs it again right after its next tick instead of an interval
    later: a fixed number of batches per interval set a ceiling on the rate a queue could sustain
    (20 batches of 500 every minute by default is 167 tasks/s), above which finished tasks piled
    up without bound."""

    def __init__(self, store: Store, metrics: Metrics, retain: dict[str, float], retain_audit_seconds: float = 0.0,
                 retain_signals_seconds: float = 0.0):
        self.store, self.metrics = store, metrics
        self.retain_audit_seconds = retain_audit_seconds  # 0 keeps them forever
        self.retain_signals_seconds = retain_signals_seconds
        # a retention of 0 keeps that state forever
        self.retain = {state: seconds for state, seconds in retain.items() if seconds > 0}
        for state in self.retain:  # at 0 until the first deletion, not absent
            metrics.tasks_deleted.labels(state)
        self.behind = False

    def _kinds(self) -> list[tuple[str, Callable[[], int]]]:
        """(label, delete one batch) for each kind of row retention deletes."""
        kinds: list[tuple[str, Callable[[], int]]] = []
        for state, seconds in self.retain.items():
            kinds.append((state, functools.partial(self.store.tasks.task_delete_finished, state, seconds,
                                                   limit=BATCH)))
        # schedule decisions are kept as long as completed tasks (the tasks they name)
        keep_fires = self.retain.get("completed")
        if keep_fires:
            kinds.append(("schedule_fires", functools.partial(self.store.schedules.schedule_fire_delete_old,
                                                              keep_fires, limit=BATCH)))
        # webhook deliveries: delivered ones like completed tasks, dead letters like failed tasks
        for state, task_state in (("delivered", "completed"), ("dead", "failed")):
            seconds = self.retain.get(task_state)
            if seconds:
                kinds.append((f"deliveries_{state}", functools.partial(
                    self.store.webhooks.webhook_delivery_delete_old, state, seconds, limit=BATCH)))
        if self.retain_signals_seconds > 0:
            kinds.append(("signals", functools.partial(self.store.steps.signal_delete_old,
                                                       self.retain_signals_seconds, limit=BATCH)))
        if self.retain_audit_seconds > 0:
            kinds.append(("audit", functools.partial(self.store.audit.audit_delete_old, self.retain_audit_seconds,
                                                     limit=BATCH)))
        return kinds

    def run_once(self) -> dict[str, int]:
        deleted: dict[str, int] = {}
        pending = self._kinds()
        deadline = time.monotonic() + RUN_SECONDS
        while pending:
            for kind in list(pending):
                label, delete = kind
                n = delete()
                if n:
                    deleted[label] = deleted.get(label, 0) + n
                    if label in self.retain:
                        self.metrics.tasks_deleted.labels(label).inc(n)
                if n < BATCH:
                    pending.remove(kind)
            if time.monotonic() >= deadline:
                break
        self.behind = bool(pending)
        if deleted:
            log.info("retention deleted old rows", extra={"deleted": deleted, "behind": self.behind})
        return deleted


class QueueGauges:
    """skiplock_queue_tasks{queue,state}, skiplock_queue_suspended_tasks{queue,reason},
    skiplock_queue_claimable_tasks{queue}, skiplock_queue_throttled_tasks{queue} and
    skiplock_queue_oldest_pending_age_seconds{queue}, refreshed from the database."""

    STATES = STATES  # every state, waiting included: a queue with none shows 0
    REASONS = SUSPENDED_REASONS  # a suspended task is waiting too: counted in both

    def __init__(self, store: Store, metrics: Metrics):
        self.store, self.metrics = store, metrics
        self._queues: set[str] = set()

    def run_once(self) -> dict[str, dict]:
        counts = self.store.tasks.queue_task_counts()
        suspended: dict[str, dict[str, int]] = {}
        for queue, reason, n in self.store.tasks.queue_suspended_counts():
            suspended.setdefault(queue, {})[reason] = n
        paused_kinds = [name for scope, name, _ in self.store.tasks.pause_list() if scope == "kind"]
        claimable = self.store.tasks.queue_claimable(paused_kinds)
        by_queue: dict[str, dict] = {}
        for queue, state, n in counts:
            by_queue.setdefault(queue, {})[state] = n
        ages: dict[str, tuple[int, float]] = {}
        throttled: dict[str, int] = {}
        for queue, n, oldest_age, paused, held_back in claimable:
            # a paused queue has nothing claimable, however old its tasks are
            ages[queue] = (0, 0.0) if paused else (n, max(0.0, oldest_age or 0.0))
            throttled[queue] = held_back
        # queues seen before and now empty report 0, not a stale value or a vanished series
        for queue in (set(by_queue) | set(ages)) - self._queues:
            # the reclaimer's counter of a queue exists at 0 before its first reclaim, so increase()
            # and the reclaims alert read 0 rather than nothing
            self.metrics.task_reclaims.labels(queue)
        self._queues |= set(by_queue) | set(ages)
        for queue in self._queues:
            states = by_queue.get(queue, {})
            for state in self.STATES:
                self.metrics.queue_tasks.labels(queue, state).set(states.get(state, 0))
            for reason in self.REASONS:
                self.metrics.queue_suspended.labels(queue, reason).set(suspended.get(queue, {}).get(reason, 0))
            n, age = ages.get(queue, (0, 0.0))
            self.metrics.queue_claimable.labels(queue).set(n)
            self.metrics.queue_throttled.labels(queue).set(throttled.get(queue, 0))
            self.metrics.queue_oldest_pending_age.labels(queue).set(age)
        return {queue: {"tasks": by_queue.get(queue, {}), "suspended": suspended.get(queue, {}),
                        "claimable": ages.get(queue, (0, 0.0))[0],
                        "throttled": throttled.get(queue, 0),
                        "oldest_age": ages.get(queue, (0, 0.0))[1]} for queue in self._queues}


# a drained group's row is deleted after this long unvisited (and with its bucket full)
LIMIT_GROUP_IDLE_SECONDS = 600.0


class LimitUpkeep:
    """Flow control's upkeep: puts back into the claim's rotation a group whose parked tasks a
    race left out of it (limit_group_wake), deletes groups idle for LIMIT_GROUP_IDLE_SECONDS, and
    refreshes skiplock_tasks_throttled, skiplock_limit_saturation and skiplock_limit_tokens per
    limited kind."""

    def __init__(self, store: Store, metrics: Metrics, idle_seconds: float = LIMIT_GROUP_IDLE_SECONDS):
        self.store, self.metrics, self.idle_seconds = store, metrics, idle_seconds
        self._kinds: set[str] = set()

    def run_once(self) -> dict[str, int]:
        woken = self.store.limits.limit_group_wake()
        if woken:
            log.info("limit groups put back into the rotation", extra={"groups": woken})
        deleted = self.store.limits.limit_group_delete_idle(self.idle_seconds)
        stats = self.store.limits.limit_stats()
        kinds = {s.kind for s in stats}
        for kind in self._kinds - kinds:  # a deleted limit: its series go, not a stale value
            for gauge in (self.metrics.tasks_throttled, self.metrics.limit_saturation, self.metrics.limit_tokens):
                try:
                    gauge.remove(kind)
                except KeyError:
                    pass
        self._kinds = kinds
        for s in stats:
            self.metrics.tasks_throttled.labels(s.kind).set(s.throttled)
            if s.saturation is not None:
                self.metrics.limit_saturation.labels(s.kind).set(s.saturation)
            if s.tokens is not None:
                self.metrics.limit_tokens.labels(s.kind).set(s.tokens)
        return {"woken": woken, "deleted": deleted, "kinds": len(stats)}


# a worker's registry row is stale when its heartbeat is older than this many of its leases
STALE_WORKER_LEASES = 3


class StaleWorkers:
    """Deletes the registry rows of workers that died without exiting (kill -9, a lost node):
    those whose heartbeat is older than STALE_WORKER_LEASES of their own leases. Their claims are
    the reclaimer's, through the leases, whatever this does."""

    def __init__(self, store: Store, metrics: Metrics, leases: float = STALE_WORKER_LEASES):
        self.store, self.metrics, self.leases = store, metrics, leases

    def run_once(self) -> int:
        removed = self.store.workers.worker_delete_stale(self.leases)
        if removed:
            self.metrics.workers_removed.inc(len(removed))
            log.info("removed workers whose heartbeat stopped",
                     extra={"workers": [worker_id for worker_id, _host, _pid in removed]})
        return len(removed)


class WorkerGauges:
    """skiplock_workers{queue} and skiplock_workers_concurrency{queue}, from the worker registry."""

    def __init__(self, store: Store, metrics: Metrics):
        self.store, self.metrics = store, metrics
        self._queues: set[str] = set()

    def run_once(self) -> dict[str, tuple[int, int]]:
        counts = {queue: (workers, concurrency) for queue, workers, concurrency in self.store.workers.worker_queue_counts()}
        # a queue whose last worker left reports 0, not its last value
        self._queues |= set(counts)
        for queue in self._queues:
            workers, concurrency = counts.get(queue, (0, 0))
            self.metrics.workers.labels(queue).set(workers)
            self.metrics.workers_concurrency.labels(queue).set(concurrency)
        return counts

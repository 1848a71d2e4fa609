"""What the completer's writes come to, counted: the tasks finished by queue, kind and outcome,
their run times, outcomes refused by their fence (stale writes) and rows found BUSY; then the
runs are let go in Slots. The completer's writer thread and, for a handler's own transaction,
the handler's thread call it; prometheus children are cached here (labels() takes a lock and
builds a tuple per call), and a dict's get and set are atomic, so a child made twice is harmless.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from ..engine.logs import log_task_failed
from ..engine.metrics import Metrics, observe_many
from .slots import Run, Slots

log = logging.getLogger("skiplock.worker")


class OutcomeRecords:
    def __init__(self, metrics: Metrics, slots: Slots):
        self.metrics, self.slots = metrics, slots
        self._children: dict = {}

    def count_busy(self, runs: Sequence[Run]) -> None:
        by_queue: dict[str, int] = {}
        for run in runs:
            by_queue[run.task.queue] = by_queue.get(run.task.queue, 0) + 1
        for queue, n in by_queue.items():
            self._child(self.metrics.outcome_writes_busy, queue).inc(n)

    def record(self, runs: Sequence[Run], applied: dict[uuid.UUID, str]) -> None:
        finished: dict[tuple[str, str, str], int] = {}
        durations: dict[tuple[str, str], list[float]] = {}
        settled = rejected = 0
        for run in runs:
            task = run.task
            if run.elapsed is not None:
                durations.setdefault((task.queue, task.kind), []).append(run.elapsed)
            state = applied.get(task.id)
            operation = run.settlement.outcome
            if state is None:
                self.refused(operation, run)
                rejected += 1
                continue
            if state == "failed":
                log_task_failed(log, task_id=task.id, kind=task.kind, queue=task.queue, attempts=task.attempt,
                                error=run.settlement.error)
            settled += 1
            key = (task.queue, task.kind, _outcome_label(operation, state))
            finished[key] = finished.get(key, 0) + 1
        for labels, n in finished.items():
            self._child(self.metrics.tasks_finished, *labels).inc(n)
        for labels, values in durations.items():
            observe_many(self._child(self.metrics.task_duration, *labels), values)
        # after the metrics: whoever sees the counts sees the metrics they count
        self.slots.written(runs, settled, rejected)

    def reject(self, operation: str, runs: Sequence[Run]) -> None:
        """Count and log writes of `operation` that found their claims lost."""
        for run in runs:
            self.refused(operation, run)
        self.slots.count("rejected", len(runs))

    def refused(self, operation: str, run: Run) -> None:
        self.metrics.stale_writes_rejected.labels(operation).inc()
        log.warning("stale write rejected: the claim was lost",
                    extra={"task_id": str(run.task.id), "operation": operation,
                           "lease_token": run.task.lease_token})

    def _child(self, metric, *labels):
        """metric.labels(*labels), cached: labels() takes a lock and builds a tuple per call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def _outcome_label(operation: str, state: str) -> str:
    if state in ("completed", "failed", "cancelled"):
        return state
    return {"retry": "retried", "step": "checkpoint", "released": "released",
            "suspend": "suspended"}.get(operation, operation)

"""A skiplock task row as Django's TaskResult, and the run options of a Django task.

States map to TaskResultStatus: waiting and queued are READY (a task that will be tried again
is READY too, as Django defines it), running and cancelling are RUNNING, completed is
SUCCESSFUL, failed and cancelled are FAILED (Django has no cancelled status; a cancelled task's
errors are the ones it had, maybe none). errors has one TaskError per event that recorded one
(each failed attempt, each reclaimed lease), oldest first; worker_ids one name per run started.
"""

from __future__ import annotations

import builtins
import dataclasses

from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string

from skiplock.engine.errors import InvalidInput

STATUSES = {"waiting": TaskResultStatus.READY, "queued": TaskResultStatus.READY,
            "running": TaskResultStatus.RUNNING, "cancelling": TaskResultStatus.RUNNING,
            "completed": TaskResultStatus.SUCCESSFUL,
            "failed": TaskResultStatus.FAILED, "cancelled": TaskResultStatus.FAILED}


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a worker runs a Django task's kind: attempts, backoff (seconds), timeout (seconds)."""

    max_attempts: int = 1
    retry_base: float = 2.0
    retry_cap: float = 900.0
    timeout: float | None = None

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise InvalidInput(f"MAX_ATTEMPTS {self.max_attempts!r}: must be a whole number >= 1")
        for name in ("retry_base", "retry_cap"):
            if not isinstance(getattr(self, name), (int, float)) or not getattr(self, name) > 0:
                raise InvalidInput(f"{name.upper()} {getattr(self, name)!r}: must be a number of seconds > 0")
        if self.retry_cap < self.retry_base:
            raise InvalidInput(f"RETRY_CAP {self.retry_cap!r} is below RETRY_BASE {self.retry_base!r}")
        if self.timeout is not None and (not isinstance(self.timeout, (int, float)) or not self.timeout > 0):
            raise InvalidInput(f"TIMEOUT {self.timeout!r}: must be a number of seconds > 0, or None")


def django_task(backend, kind: str, queue: str, priority: int) -> Task:
    """The Django Task of a skiplock kind (its module path), as it was enqueued."""
    try:
        task = import_string(kind)
    except ImportError:
        task = None
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"kind {kind!r} is not the module path of a Django task")
    try:
        return task.using(priority=priority, queue_name=queue, backend=backend.alias)
    except Exception:  # noqa: BLE001 - e.g. a queue the CLI chose that QUEUES lacks: the task as declared
        return task


def task_result(backend, row, events) -> TaskResult:
    payload = row.payload if isinstance(row.payload, dict) else {}
    runs = [e for e in events if e.type == "running"]
    result = TaskResult(
        task=django_task(backend, row.kind, row.queue, row.priority), id=str(row.id),
        status=STATUSES[row.state], enqueued_at=row.created_at, started_at=runs[0].at if runs else None,
        finished_at=row.finished_at, last_attempted_at=runs[-1].at if runs else None,
        args=payload.get("args", []), kwargs=payload.get("kwargs", {}), backend=backend.alias,
        errors=[task_error(e.data) for e in events if isinstance(e.data, dict) and e.data.get("error")],
        worker_ids=[(e.data or {}).get("owner") or "" for e in runs])
    object.__setattr__(result, "_return_value", row.result)
    return result


def task_error(data: dict) -> TaskError:
    """An event's error as Django's TaskError: the exception's class path from the traceback's
    last line (`orders.tasks.Declined: ...`), else from the error's (`TimeoutError: ...`)."""
    trace = data.get("traceback") or ""
    lines = [line for line in trace.splitlines() if line and not line.startswith(" ")]
    name = (lines[-1] if lines else data["error"]).partition(":")[0].strip()
    if "." not in name and hasattr(builtins, name):
        name = f"builtins.{name}"
    return TaskError(exception_class_path=name, traceback=trace or data["error"])

"""What an operator does to tasks, each with its audit row: cancel or resume one task, and the
bulk actions (retry, cancel, purge) on the tasks of a filter. The API's routes and the `skiplock`
command call these, so both change the same rows, write the same events and leave the same
audit rows (the API's actor is the token's name, the command's `cli:<os user>`).

A bulk action is batched (the store's `task_*_many` methods: short transactions, SKIP LOCKED) and
leaves ONE audit row with the count, committed with its last batch. It is safe to repeat: each
acts only on the states its single-task action accepts, so a repeat changes only what is left.
This module decides nothing about HTTP or the command line; the store runs the queries.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from .errors import InvalidInput
from .model import STATES
from .store import Store

# A bulk action changes at most this many tasks unless told otherwise, and never more than
# BULK_MAX_LIMIT in one call; it commits every BULK_BATCH_SIZE rows.
BULK_DEFAULT_LIMIT = 1000
BULK_MAX_LIMIT = 10_000
BULK_BATCH_SIZE = 500
BULK_MAX_IDS = 1000

# action → (the states it acts on, its audit action)
BULK_ACTIONS = {
    "retry": (("failed", "cancelled"), "task.retry_many"),
    "cancel": (("waiting", "queued", "running"), "task.cancel_many"),
    "purge": (("completed", "failed", "cancelled"), "task.purge_many"),
}


@dataclasses.dataclass(frozen=True)
class TaskFilter:
    """Which tasks: every given criterion must hold (None: any)."""

    queue: str | None = None
    state: str | None = None
    kind: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    ids: tuple[uuid.UUID, ...] | None = None

    def __post_init__(self):
        if self.state is not None and self.state not in STATES:
            raise InvalidInput(f"state {self.state!r}: must be one of {', '.join(STATES)}")
        if self.ids is not None and not 1 <= len(self.ids) <= BULK_MAX_IDS:
            raise InvalidInput(f"ids: give 1 to {BULK_MAX_IDS} task ids")

    def is_empty(self) -> bool:
        return all(v is None for v in dataclasses.asdict(self).values())

    def params(self) -> dict[str, Any]:
        """The store's filter arguments."""
        return {**dataclasses.asdict(self), "idempotency_key": None,
                "ids": None if self.ids is None else list(self.ids)}

    def as_json(self) -> dict[str, Any]:
        """The given criteria, for the audit row."""
        out = {}
        for name, value in dataclasses.asdict(self).items():
            if isinstance(value, dt.datetime):
                value = value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
            elif name == "ids" and value is not None:
                value = [str(v) for v in value]
            if value is not None:
                out[name] = value
        return out


def check_bulk(action: str, task_filter: TaskFilter, limit: int) -> None:
    """Refuse what would surprise: no filter at all, a state the action never touches, a limit
    out of bounds."""
    states, _ = BULK_ACTIONS[action]
    if task_filter.is_empty():
        raise InvalidInput(f"{action} of many tasks needs a filter: queue, state, kind, created_after, "
                           "created_before or ids")
    if task_filter.state is not None and task_filter.state not in states:
        raise InvalidInput(f"state {task_filter.state!r}: {action} acts on {' or '.join(states)} tasks only")
    if not 1 <= limit <= BULK_MAX_LIMIT:
        raise InvalidInput(f"limit {limit}: must be 1-{BULK_MAX_LIMIT}")


def bulk(store: Store, action: str, task_filter: TaskFilter, *, actor: str, limit: int = BULK_DEFAULT_LIMIT,
         reason: str | None = None, request_id: str | None = None, batch_size: int = BULK_BATCH_SIZE) -> int:
    """Run a bulk action ('retry', 'cancel' or 'purge'); returns how many tasks changed.

    The changed tasks' events carry {"by": actor, "reason": reason}, as the single-task
    actions' do. The audit row: target None, detail {"changed", "limit", "filter"}."""
    check_bulk(action, task_filter, limit)
    _, audit_action = BULK_ACTIONS[action]

    def audit(tx: Store, changed: int) -> None:
        detail = {"changed": changed, "limit": limit, "filter": task_filter.as_json()}
        if reason:
            detail["reason"] = reason
        tx.audit.audit_insert(actor=actor, action=audit_action, target=None, request_id=request_id, outcome="ok",
                              detail=detail)

    params = task_filter.params()
    if action == "purge":
        return store.tasks.task_purge_many(params, limit, batch_size=batch_size, last=audit)
    run = store.tasks.task_retry_many if action == "retry" else store.tasks.task_cancel_many
    return run(params, limit, event_data(actor, reason), batch_size=batch_size, last=audit)


def event_data(actor: str, reason: str | None) -> dict:
    """The data of the event an operator's cancel or resume writes."""
    data = {"by": actor}
    if reason:
        data["reason"] = reason
    return data


def cancel_task(store: Store, task_id: uuid.UUID | str, *, actor: str, reason: str | None = None,
                request_id: str | None = None) -> str:
    """Cancel one task (Store.cancel) and audit it as task.cancel; returns its state now."""
    return _one(store, "cancel", task_id, actor, reason, request_id)


def resume_task(store: Store, task_id: uuid.UUID | str, *, actor: str, reason: str | None = None,
                request_id: str | None = None) -> str:
    """Resume one failed or cancelled task (Store.resume) and audit it as task.resume."""
    return _one(store, "resume", task_id, actor, reason, request_id)


def _one(store: Store, action: str, task_id: uuid.UUID | str, actor: str, reason: str | None,
         request_id: str | None) -> str:
    with store.transaction() as tx:
        state = getattr(tx.tasks, f"task_{action}")(task_id, event_data(actor, reason))
        tx.audit.audit_insert(actor=actor, action=f"task.{action}", target=str(task_id), request_id=request_id,
                              outcome="ok", detail={"state": state})
    return state


def set_paused(store: Store, scope: str, name: str, paused: bool, *, actor: str,
               request_id: str | None = None) -> None:
    """Pause or resume a queue or a task kind (`scope`), audited as `<scope>.pause|resume`.
    Idempotent: pausing a paused one changes nothing (and is still recorded)."""
    with store.transaction() as tx:
        if paused:
            tx.tasks.pause_set(scope, name)
        else:
            tx.tasks.pause_clear(scope, name)
        tx.audit.audit_insert(actor=actor, action=f"{scope}.{'pause' if paused else 'resume'}", target=name,
                              request_id=request_id, outcome="ok")

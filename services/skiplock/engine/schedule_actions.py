"""What an operator does to schedules, shared by the API, the CLI and the scheduler's file:
apply definitions, pause or resume one, fire one now. Each is one transaction of the store's
statements; this module decides nothing about HTTP or the command line.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from .errors import InvalidInput
from .model import TaskSpec
from .schedules import Schedule, check_schedule_payloads, idempotency_key
from .store import Store


def apply_schedules(store: Store, schedules: Sequence[Schedule], *, prune: bool = False,
                    now: dt.datetime | None = None, max_payload_bytes: int = 1024 * 1024) -> dict[str, list[str]]:
    """Upsert definitions in one transaction; `prune` deletes schedules not among them.
    New and re-timed schedules start at their first fire after `now` (the database's).
    Returns the names {'created': [...], 'updated': [...], 'unchanged': [...], 'deleted': [...]}."""
    names = [s.name for s in schedules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidInput(f"schedule name {duplicates[0]!r} is defined more than once")
    check_schedule_payloads(schedules, max_payload_bytes)
    report: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "deleted": []}
    with store.transaction() as tx:
        now = tx.schedules.schedule_now(now)
        for s in schedules:
            created = tx.schedules.schedule_upsert(s, s.first_fire(now))
            report["unchanged" if created is None else "created" if created else "updated"].append(s.name)
        if prune:
            report["deleted"] = tx.schedules.schedule_delete_except(names)
    return report


def set_schedule_enabled(store: Store, name: str, enabled: bool) -> None:
    """Pause (enabled=False) or resume a schedule. Resuming starts at the first fire after
    now: the fires a paused schedule did not make are not caught up."""
    # one transaction's connection: a one-connection pool (the CLI) has no other
    with store.transaction() as tx:
        now = tx.schedules.schedule_now()
        schedule = tx.schedules.schedule_get(name).schedule
        tx.schedules.schedule_set_enabled(name, enabled, schedule.first_fire(now))


def fire_schedule_now(store: Store, name: str, *, detail: str, max_payload_bytes: int = 1024 * 1024
                      ) -> tuple[dt.datetime, uuid.UUID, bool]:
    """Fire a schedule at once, under its current tick (Schedule.current_tick) and that tick's
    idempotency key: (nominal time, task id, whether this call fired it). A second call in the
    same tick, or one after the scheduler fired that time, finds the same task."""
    with store.transaction() as tx:
        # the row lock keeps a scheduler tick (SKIP LOCKED) and a PATCH off this schedule meanwhile
        tx.schedules.schedule_lock(name)
        now = tx.schedules.schedule_now()
        status = tx.schedules.schedule_get(name)
        schedule = status.schedule
        nominal = schedule.current_tick(status.next_fire_at, now)
        spec = TaskSpec(schedule.kind, schedule.payload, queue=schedule.queue, priority=schedule.priority,
                        max_attempts=schedule.max_attempts, max_payload_bytes=max_payload_bytes,
                        idempotency_key=idempotency_key(name, nominal))
        [task_id] = tx.tasks.task_insert([spec])
        fired = tx.schedules.schedule_fire_now_record(name, nominal, task_id, detail)
        if fired:
            tx.schedules.schedule_advance(name, next_fire_at=status.next_fire_at,
                                          buffered_fire_at=status.buffered_fire_at, last_fire_at=nominal,
                                          last_task_id=task_id, fires=1, skips=0)
    return nominal, task_id, fired

"""The schedules and their fires: one method per statement of engine/sql/schedules.sql (and the
schedule lock of api.sql, the retention of maintenance.sql), named after it.

What a tick fires, skips or buffers is the scheduler's decision (scheduler/firing.py); applying
a file of definitions is engine/schedule_actions.py's. These methods only run the statements.
"""

from __future__ import annotations

import collections
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from ..errors import ScheduleNotFound
from ..schedules import Schedule, ScheduleStatus
from .database import Database
from .rows import row_fields

# A row of schedule_list and schedule_get: a Schedule's fields, then a ScheduleStatus's after
# its `schedule`. Made from both, so that renaming a field of either shows in the columns test.
ScheduleRow = collections.namedtuple("ScheduleRow", row_fields(Schedule) + row_fields(ScheduleStatus)[1:])
_SCHEDULE_FIELDS = len(row_fields(Schedule))


def _status(row: ScheduleRow) -> ScheduleStatus:
    return ScheduleStatus(Schedule(*row[:_SCHEDULE_FIELDS]), *row[_SCHEDULE_FIELDS:])


class DueSchedule(NamedTuple):
    """A row of schedule_claim_due: an enabled schedule with a fire due, locked for this tick."""

    name: str
    kind: str
    queue: str
    payload: Any
    priority: int
    max_attempts: int | None
    cron: str | None
    timezone: str
    interval_seconds: float | None
    overlap: str
    catchup: str
    catchup_window_seconds: float
    jitter_seconds: float
    next_fire_at: dt.datetime
    buffered_fire_at: dt.datetime | None
    last_task_id: uuid.UUID | None
    previous_state: str | None  # of the task last_task_id names

    def schedule(self) -> Schedule:
        """The definition (validated: a row edited by hand may raise InvalidInput)."""
        return Schedule(*self[:13], enabled=True)


class ScheduleStore:
    """Queries of the schedules and schedule_fires tables."""

    def __init__(self, db: Database):
        self.db = db

    def schedule_now(self, now: dt.datetime | None = None) -> dt.datetime:
        """The database's now(), or `now` when given (tests pin it)."""
        return self.db.fetch("schedule_now", {"now": now})[0][0]

    def schedule_claim_due(self, now: dt.datetime, limit: int) -> list[DueSchedule]:
        """Lock the schedules due at `now` (skipping those another replica holds) until the
        transaction ends: call it on a transaction's store."""
        return self.db.fetch_as("schedule_claim_due", {"now": now, "limit": limit}, DueSchedule)

    def schedule_postpone(self, name: str, now: dt.datetime) -> None:
        """Look at a schedule that cannot fire again in a minute."""
        with self.db.connection() as conn:
            conn.execute(self.db.sql["schedule_postpone"], {"name": name, "now": now})

    def schedule_fire_record(self, schedule: str, nominal_ats: Sequence[dt.datetime], outcomes: Sequence[str],
                             task_ids: Sequence[uuid.UUID | None], details: Sequence[str | None]) -> None:
        with self.db.connection() as conn:
            conn.execute(self.db.sql["schedule_fire_record"], dict(
                schedule=schedule, nominal_ats=list(nominal_ats), outcomes=list(outcomes),
                task_ids=list(task_ids), details=list(details)))

    def schedule_fire_now_record(self, schedule: str, nominal_at: dt.datetime, task_id: uuid.UUID,
                                 detail: str | None) -> bool:
        """Record a fire made by hand; False when that nominal time was already fired."""
        return bool(self.db.fetch("schedule_fire_now_record", dict(
            schedule=schedule, nominal_at=nominal_at, task_id=task_id, detail=detail)))

    def schedule_advance(self, name: str, *, next_fire_at: dt.datetime, buffered_fire_at: dt.datetime | None,
                         last_fire_at: dt.datetime | None, last_task_id: uuid.UUID | None,
                         fires: int, skips: int) -> None:
        with self.db.connection() as conn:
            conn.execute(self.db.sql["schedule_advance"], dict(
                name=name, next_fire_at=next_fire_at, buffered_fire_at=buffered_fire_at,
                last_fire_at=last_fire_at, last_task_id=last_task_id, fires=fires, skips=skips))

    def schedule_next_due(self) -> float | None:
        """Seconds until the soonest enabled schedule is due (negative: overdue; None: none)."""
        rows = self.db.fetch("schedule_next_due", {})
        return rows[0][0] if rows else None

    def schedule_upsert(self, schedule: Schedule, next_fire_at: dt.datetime) -> bool | None:
        """Insert or update a definition: True when it created the row, False when it changed
        it, None when the row already said the same."""
        params = schedule.as_dict()
        params.update(payload=Jsonb(schedule.payload), next_fire_at=next_fire_at)
        rows = self.db.fetch("schedule_upsert", params)
        return rows[0][1] if rows else None

    def schedule_delete_except(self, names: Sequence[str]) -> list[str]:
        """Delete every schedule not named; returns the names deleted, sorted."""
        return sorted(r[0] for r in self.db.fetch("schedule_delete_except", {"names": list(names)}))

    def schedule_delete(self, name: str) -> None:
        if not self.db.fetch("schedule_delete", {"name": name}):
            raise ScheduleNotFound(f"schedule {name!r} not found")

    def schedule_set_enabled(self, name: str, enabled: bool, next_fire_at: dt.datetime) -> None:
        """Pause or resume; a resumed schedule's next fire is `next_fire_at`."""
        if not self.db.fetch("schedule_set_enabled", dict(name=name, enabled=enabled, next_fire_at=next_fire_at)):
            raise ScheduleNotFound(f"schedule {name!r} not found")

    def schedule_list(self) -> list[ScheduleStatus]:
        return [_status(row) for row in self.db.fetch_as("schedule_list", {}, ScheduleRow)]

    def schedule_get(self, name: str) -> ScheduleStatus:
        rows = self.db.fetch_as("schedule_get", {"name": name}, ScheduleRow)
        if not rows:
            raise ScheduleNotFound(f"schedule {name!r} not found")
        return _status(rows[0])

    def schedule_lock(self, name: str) -> None:
        """Hold a schedule's row until the transaction ends (call on a transaction's store)."""
        if not self.db.fetch("schedule_lock", {"name": name}):
            raise ScheduleNotFound(f"schedule {name!r} not found")

    def schedule_fires_list(self, name: str, limit: int = 100) -> list[tuple]:
        return self.db.fetch("schedule_fires_list", {"schedule": name, "limit": limit})

    def schedule_fire_delete_old(self, older_than_seconds: float, limit: int = 500) -> int:
        return len(self.db.fetch("schedule_fire_delete_old", dict(older_than=older_than_seconds, limit=limit)))

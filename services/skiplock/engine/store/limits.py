"""Flow control's tables (skiplock.limits, skiplock.limit_groups): one method per statement of
engine/sql/limits.sql, named after it. The claim's statements are the task store's
(task_claim, task_claim_limited); what a limit means is engine/limits.py's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import NamedTuple

from ..errors import InvalidInput
from ..limits import Limit
from .database import Database


class LimitRecord(NamedTuple):
    limit: Limit
    updated_at: dt.datetime


class LimitStats(NamedTuple):
    """A limited kind as the claim sees it now (limit_stats)."""

    kind: str
    concurrency: int | None
    throttled: int          # queued tasks the limit holds back (parked)
    running: int            # live runs (lease not expired)
    busy_groups: int        # groups with runs or parked tasks
    tokens: float | None    # tokens in the emptiest bucket among groups with parked tasks

    @property
    def saturation(self) -> float | None:
        """Live runs over what the concurrency limit allows the groups with work (None: no
        concurrency limit); 1.0 when no group has work is not saturation, so 0.0 then."""
        if self.concurrency is None:
            return None
        return self.running / (self.concurrency * self.busy_groups) if self.busy_groups else 0.0


# why a limit is refused on the distributed placement (and the placement, while limits exist)
NOT_DISTRIBUTED = ("limits do not run on a distributed (Citus) placement yet: the tasks of a limited kind "
                   "would wait for good")


class LimitStore:
    """Queries of the limits and their groups."""

    def __init__(self, db: Database):
        self.db = db

    @staticmethod
    def _record(row) -> LimitRecord:
        kind, concurrency, rate_count, rate_seconds, burst, updated_at = row
        return LimitRecord(Limit(kind, concurrency, rate_count, rate_seconds, burst), updated_at)

    def limit_list(self) -> list[LimitRecord]:
        return [self._record(r) for r in self.db.fetch("limit_list", {})]

    def limit_get(self, kind: str) -> LimitRecord | None:
        rows = self.db.fetch("limit_get", {"kind": kind})
        return self._record(rows[0]) if rows else None

    def limit_upsert(self, limit: Limit) -> bool | None:
        """True: created; False: changed; None: it was already so. Refused on the distributed
        placement, where no claim serves a limited kind yet (its tasks would wait)."""
        if self.db.distributed:
            raise InvalidInput(NOT_DISTRIBUTED)
        rows = self.db.fetch("limit_upsert", dict(kind=limit.kind, concurrency=limit.concurrency,
                                                  rate_count=limit.rate_count, rate_seconds=limit.rate_seconds,
                                                  burst=limit.burst))
        return rows[0][0] if rows else None

    def limit_delete(self, kinds: Sequence[str]) -> list[str]:
        """The kinds whose limit was deleted; their parked tasks are claimable again at once."""
        return [r[0] for r in self.db.fetch("limit_delete", {"kinds": list(kinds), "channel": self.db.channel})]

    def limit_kinds(self) -> list[str]:
        return [r[0] for r in self.db.fetch("limit_kinds", {})]

    def limit_group_wake(self) -> int:
        """Groups with parked tasks put back into the rotation (the backstop of a race). On the
        distributed placement no task is parked (limits do not run there yet): none."""
        if self.db.distributed:
            return 0
        return len(self.db.fetch("limit_group_wake", {}))

    def limit_group_delete_idle(self, idle_seconds: float, limit: int = 1000) -> int:
        if self.db.distributed:
            return 0
        return len(self.db.fetch("limit_group_delete_idle", {"idle_seconds": idle_seconds, "limit": limit}))

    def limit_stats(self) -> list[LimitStats]:
        if self.db.distributed:  # no limit runs there yet (docs/SCALING.md)
            return []
        return self.db.fetch_as("limit_stats", {}, LimitStats)

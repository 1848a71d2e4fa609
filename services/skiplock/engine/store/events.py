"""The task event feed's reads (engine/sql/events.sql): every task's events in one resumable
order, from a cursor.

A cursor is a position in that order, (xid, task_id, seq) of the last event passed, written as
text for clients. It runs the statement and moves the cursor; how long a reader waits for
events, and what it sends them to, are the API's (api/events.py).
"""

from __future__ import annotations

import re
import uuid
from typing import NamedTuple

from ..errors import InvalidInput
from ..model import TaskEvent
from .database import Database

NIL = uuid.UUID(int=0)
# events a read looks at past the cursor, whatever its filters keep: a rare queue's reader costs a
# bounded read per call, and its cursor still moves past what it skipped
SCAN_LIMIT = 2000
_XID_MAX = 2**64 - 1
_SEQ_MAX = 2**31 - 1
_CURSOR = re.compile(r"([0-9]{1,20})(?:-([0-9a-f]{32})-([0-9]{1,10}))?")
CURSOR_PATTERN = "^" + _CURSOR.pattern + "$"


class FeedCursor(NamedTuple):
    """A position in the feed: after the event (xid, task_id, seq). `FeedCursor(x)` is before
    every event of transaction x; `FeedCursor(0)`, before every event the feed holds."""

    xid: int
    task_id: uuid.UUID = NIL
    seq: int = 0

    def text(self) -> str:
        if self.task_id == NIL and self.seq == 0:
            return str(self.xid)
        return f"{self.xid}-{self.task_id.hex}-{self.seq}"

    @classmethod
    def parse(cls, text: str, name: str = "after") -> "FeedCursor":
        """The cursor a feed answer gave (`cursor`, or an event's `id`); InvalidInput naming
        `name` otherwise."""
        found = _CURSOR.fullmatch(text)
        if found is None or int(found[1]) > _XID_MAX or (found[3] is not None and int(found[3]) > _SEQ_MAX):
            raise InvalidInput(f"{name} {text[:80]!r}: not a feed cursor (use the `cursor` of an answer, or an "
                               "event's `id`)")
        if found[2] is None:
            return cls(int(found[1]))
        return cls(int(found[1]), uuid.UUID(hex=found[2]), int(found[3]))


class FeedEvent(NamedTuple):
    """One task event as the feed gives it: where it is (`cursor`), and its task's queue and kind."""

    cursor: FeedCursor
    queue: str
    kind: str
    event: TaskEvent


class FeedPage(NamedTuple):
    """The events of one read, and the cursor the next read starts from (past them, and past the
    events the filters left out)."""

    events: list[FeedEvent]
    cursor: FeedCursor


class EventStore:
    """Queries of the feed over task_events."""

    def __init__(self, db: Database):
        self.db = db

    def event_feed_read(self, after: FeedCursor | None, *, queue: str | None = None, kind: str | None = None,
                        task_id: uuid.UUID | None = None, limit: int = 100, scan: int = SCAN_LIMIT) -> FeedPage:
        """Up to `limit` events after `after` of the queue, kind and task given (None: any), in
        feed order. `after` None: the feed from now (no events; the cursor is the horizon)."""
        start = after if after is not None else FeedCursor(_XID_MAX, NIL, _SEQ_MAX)
        rows = self.db.fetch("event_feed_read", dict(
            xid=str(start.xid), task_id=start.task_id, seq=start.seq, queue=queue, kind=kind, task=task_id,
            limit=limit, scan=max(scan, limit)))
        horizon, last_xid, last_task_id, last_seq, scanned = rows[-1][10:]
        events = [FeedEvent(FeedCursor(int(r[0]), r[1], r[2]), r[8], r[9], TaskEvent(*r[1:8]))
                  for r in rows if r[1] is not None]
        if after is None:
            return FeedPage([], FeedCursor(int(horizon)))
        if len(events) == limit:
            cursor = events[-1].cursor
        elif scanned >= max(scan, limit):  # more to scan: the next read goes on from the last one seen
            cursor = FeedCursor(int(last_xid), last_task_id, last_seq)
        else:  # every event below the horizon is passed: the next read starts there
            cursor = max(after, FeedCursor(int(horizon)))
        return FeedPage(events, cursor)

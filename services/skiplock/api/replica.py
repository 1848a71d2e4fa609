"""Reads on a replica (SKIPLOCK_READ_DATABASE_URL): which database serves a read-only route.

Each route declares where its reads may go (`reads="replica"` in its @operation; the default is
the primary), and this module applies the declaration to each request. The rule:

- Replica: the GET routes that show what workers, schedulers and other clients change — tasks and
  their events and steps, signals, queues and their throughput, schedules and their fires, flow-control limits,
  workers, webhook endpoints, deliveries. A replica's copy, behind by its replication lag, serves them as well as
  the primary's: the state they show changes under the reader anyway.
- Primary, always: every write, and every read made in a write's transaction (a submission's
  answer and its Idempotency-Key replay lookup, the task returned by cancel and resume, a
  schedule's PATCH); the audit log (an admin reads it to see what was just done); /readyz (it
  answers for the primary); the console's session (no table). Tokens are configuration: no read.
- Primary, for a long-poll: a task read with `wait` (GET /v1/tasks/{id}?wait=) listens for the
  task's end on the primary, and reads it there.
- Primary, when the caller must see its own writes: a request with `Skiplock-Read-From: primary`;
  a console page after one of the console's actions, until the replica has replayed that write
  (the primary's WAL position after it travels in a cookie, console/views.py).
- Primary, when the replica cannot serve: it does not answer (the read runs again on the primary,
  and the replica is left alone for DOWN_SECONDS), or it is further behind the primary than
  SKIPLOCK_READ_MAX_LAG_SECONDS. So a replica that is down or lagging costs the primary its reads
  back, never an answer: no route answers 503 for the replica's sake, and /readyz ignores it.

How far behind: every LAG_CHECK_SECONDS at most (when reads come), one request thread reads the
primary's flushed WAL position and then the replica's replayed one. The lag is the age of the
oldest primary position the replica has not replayed yet: how old the newest data is that the
replica may be missing, to within a check's interval. An idle primary is behind nothing
(`now() - pg_last_xact_replay_timestamp()` would call it lagging), and a replica cut off from its
primary lags more with every check (its own view would say it is caught up).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from flask import g

from ..engine.errors import DatabaseUnavailable, SkiplockError, StatementTimeout
from ..engine.store import Store
from .app_state import api
from .request_metrics import ApiMetrics

log = logging.getLogger("skiplock.api")

# The request header with which a caller asks for the primary (its value: `primary`).
READ_FROM = "Skiplock-Read-From"
# How often a gunicorn worker measures the replica's lag, at most (two one-row statements).
LAG_CHECK_SECONDS = 1.0
# After the replica failed a read, its reads go to the primary this long before it is tried again.
DOWN_SECONDS = 5.0
# The longest a read waits for a replica connection (one being opened) before it goes to the
# primary: a replica that is restarting or unreachable costs a read this much, once per DOWN_SECONDS.
BORROW_TIMEOUT = 1.0
# The primary's positions kept while the replica has not replayed them: one per check; a replica
# that stops replaying for longer than this many checks shows at least that lag.
_POSITIONS = 3600


class Replica:
    """The replica of one app: its store, how far behind the primary it was when last measured,
    and whether it answered. Shared by the request threads of one gunicorn worker; the lock is
    held only by the one thread that measures."""

    def __init__(self, primary: Store, store: Store, max_lag: float, metrics: ApiMetrics):
        self.primary = primary
        self.store = store
        self.max_lag = max_lag
        self.metrics = metrics
        self._measuring = threading.Lock()
        self._next_check = 0.0  # time.monotonic()
        self._down = False
        self._lagging = False
        self.lag: float | None = None  # seconds, when last measured; None: not yet
        self._replayed = -1  # the replica's replayed position when last read (bytes)
        self._unreplayed: deque[tuple[float, int]] = deque(maxlen=_POSITIONS)  # (when, primary's position)

    def close(self) -> None:
        self.store.close()

    def refusal(self) -> str | None:
        """Why a read that may go to the replica must not, now: `unreachable`, `lagging`; None: it may."""
        if time.monotonic() >= self._next_check and self._measuring.acquire(blocking=False):
            try:
                if time.monotonic() >= self._next_check:
                    self._measure()
            finally:
                self._measuring.release()
        if self._down:
            return "unreachable"
        return "lagging" if self._lagging else None

    def _measure(self) -> None:
        now = time.monotonic()
        try:
            position = self.primary.replication.wal_flush_position(timeout=BORROW_TIMEOUT)
        except SkiplockError:
            position = None  # the primary's trouble shows on its own routes; measure what we can
        try:
            replayed = self.store.replication.wal_replay_position()
        except SkiplockError as exc:
            self.failed(exc)
            return
        replayed = float("inf") if replayed is None else replayed
        self._replayed = replayed
        if position is not None:
            self._unreplayed.append((now, position))
        while self._unreplayed and self._unreplayed[0][1] <= replayed:
            self._unreplayed.popleft()
        self.lag = now - self._unreplayed[0][0] if self._unreplayed else 0.0
        self.metrics.replica_lag.set(self.lag)
        self._next_check = now + LAG_CHECK_SECONDS
        if self._down:
            self._down = False
            log.info("the read replica answers again: reads go to it", extra={"lag_seconds": round(self.lag, 3)})
        lagging = self.lag > self.max_lag
        if lagging != self._lagging:
            self._lagging = lagging
            if lagging:
                log.warning("the read replica lags behind the primary: its reads go to the primary",
                            extra={"lag_seconds": round(self.lag, 3), "max_lag_seconds": self.max_lag})
            else:
                log.info("the read replica caught up: reads go to it", extra={"lag_seconds": round(self.lag, 3)})

    def failed(self, exc: SkiplockError) -> None:
        """The replica did not answer: reads go to the primary for DOWN_SECONDS, then it is tried again."""
        self._next_check = time.monotonic() + DOWN_SECONDS
        if not self._down:
            self._down = True
            log.warning("the read replica does not answer: reads go to the primary",
                        extra={"error": str(exc), "retry_seconds": DOWN_SECONDS})

    def written_position(self) -> int | None:
        """The primary's WAL position after a write that just committed (None if it cannot say)."""
        try:
            return self.primary.replication.wal_insert_position()
        except SkiplockError:
            return None

    def has_replayed(self, position: int) -> bool:
        """Whether the replica has replayed the primary's WAL up to `position` (a write's)."""
        if self._replayed >= position:
            return True
        if self._down:
            return False
        try:
            replayed = self.store.replication.wal_replay_position()
        except SkiplockError as exc:
            self.failed(exc)
            return False
        self._replayed = max(self._replayed, float("inf") if replayed is None else replayed)
        return self._replayed >= position


def _requested() -> str | None:
    """`requested` when the caller asked for the primary (the header), else None."""
    return "requested" if (g.get("headers") or {}).get(READ_FROM) == "primary" else None


def _not_replayed(replica: Replica) -> str | None:
    """`not_replayed` while the console's last write is not on the replica yet, else None."""
    written = g.get("read_after")  # the console's, from its cookie
    if written is None:
        return None
    if replica.has_replayed(written):
        g.read_after, g.read_after_replayed = None, True
        return None
    return "not_replayed"


def routed(view: Callable) -> Callable:
    """`view`, a pure read, run with `reads()` (app_state.py) on the replica when the rule above
    lets it, else on the primary. A read the replica fails to answer runs again on the primary."""

    @functools.wraps(view)
    def read(**kwargs):
        ctx = api()
        replica = ctx.replica
        if replica is None:  # no SKIPLOCK_READ_DATABASE_URL: the primary, as every route
            return view(**kwargs)
        reason = _requested() or replica.refusal() or _not_replayed(replica)
        if reason is None:
            g.reads = replica.store
            try:
                response = view(**kwargs)
            except DatabaseUnavailable as exc:
                if isinstance(exc, StatementTimeout):  # as slow on the primary: the caller hears of it
                    raise
                replica.failed(exc)
                reason = "unreachable"
            else:
                ctx.metrics.reads.labels("replica", "ok").inc()
                return response
            finally:
                g.pop("reads", None)
        ctx.metrics.reads.labels("primary", reason).inc()
        return view(**kwargs)

    return read

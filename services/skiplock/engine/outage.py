"""One process's word on the database going away, instead of one line per failed attempt.

A worker meets an outage on every path at once: the claim loop, the heartbeat, the reclaim, the
wake-up, the registry beat, the outcome writer, the listener and psycopg's pools each retry on
their own, and each used to log every attempt (a 42 s outage wrote 1,261 lines). Now each reports
here: the first failure logs one line (what failed, and what the process holds meanwhile), a
reminder follows every REMIND_SECONDS while it lasts, and the first answer after it logs one line
with how long it was. The pools' own warnings are folded in by a logging filter.

An outage ends after the database has answered for SETTLE_SECONDS with no failure between: a
server going down answers a statement already in flight, and one coming back meets the pools' idle
connections that died with it, so the first answer alone would say "back" and then "away" again.
At that first answer `on_back` runs (in a thread of its own): the worker checks its pools' idle
connections there, so that the dead ones fail inside the settle period and not after it.

`OUTAGE` is the process's one Outage; the roles set `held` to say what they hold. Thread-safe:
its state changes under a lock, and `answered()`, called on every successful claim, reads one
attribute when nothing is wrong.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("skiplock.database")

REMIND_SECONDS = 30.0
SETTLE_SECONDS = 1.0


class Outage:
    def __init__(self, remind_seconds: float = REMIND_SECONDS, settle_seconds: float = SETTLE_SECONDS):
        self.remind_seconds = remind_seconds
        self.settle_seconds = settle_seconds
        self.held: Callable[[], dict] = dict  # what the process holds meanwhile, for the lines
        self.on_back: Callable[[], None] | None = None  # at the first answer after failures
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic start of the outage in progress
        self._answering_since: float | None = None  # the first answer since the last failure
        self._reminded = 0.0
        self._failures = 0

    @property
    def active(self) -> bool:
        return self._since is not None

    def failed(self, where: str, error: str) -> None:
        """A path failed to reach the database (`where`: claim, heartbeat, listener, ...)."""
        now = time.monotonic()
        with self._lock:
            self._failures += 1
            self._answering_since = None
            if self._since is None:
                self._since = self._reminded = now
                first = True
            elif now - self._reminded >= self.remind_seconds:
                self._reminded = now
                first = False
            else:
                return
            seconds, failures = now - self._since, self._failures
        if first:
            log.warning("database unreachable; retrying", extra={"where": where, "error": error[:300],
                                                                 **self._held()})
        else:
            log.warning("database still unreachable", extra={"seconds": round(seconds), "failed_attempts": failures,
                                                             "error": error[:300], **self._held()})

    def answered(self) -> None:
        """A path reached the database."""
        if self._since is None:  # the common case: one attribute read
            return
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                return
            if self._answering_since is None:
                self._answering_since = now
                settling = True
            elif now - self._answering_since >= self.settle_seconds:
                seconds, failures = self._answering_since - self._since, self._failures
                self._since = self._answering_since = None
                self._failures = 0
                settling = False
            else:
                return
        if settling:
            if self.on_back is not None:
                threading.Thread(target=self._back, name="outage-back", daemon=True).start()
            return
        log.warning("database reachable again", extra={"seconds": round(seconds, 1), "failed_attempts": failures})

    def _back(self) -> None:
        try:
            self.on_back()
        except Exception:  # noqa: BLE001 - the hook's own trouble is the next failure's to report
            log.debug("the outage's recovery hook failed", exc_info=True)

    def _held(self) -> dict:
        try:
            return dict(self.held())
        except Exception:  # noqa: BLE001 - a line about the outage must not fail on its details
            return {}


OUTAGE = Outage()


class PoolWarnings(logging.Filter):
    """psycopg_pool's warnings (a failed connection attempt, a pool that could not grow) become
    failures of the outage: one line for all of them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        OUTAGE.failed("pool", record.getMessage())
        return False

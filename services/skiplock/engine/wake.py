"""The wake-up of suspended tasks whose time came (a durable sleep's end, a signal wait's
timeout): back to `queued`, claimable at once.

Every worker runs it (worker/keeper.py) and so does the scheduler, each every WAKE_SECONDS: safe in
every replica at once (the statement locks the rows it changes with SKIP LOCKED), and a task wakes
within about that long of its time even with one role only. With nothing due the statement reads
an empty range of one partial index.
"""

from __future__ import annotations

import logging

from .store import Store

log = logging.getLogger("skiplock.maintenance")

WAKE_SECONDS = 0.5
# rows per statement, and statements per run
BATCH = 1000
MAX_BATCHES = 20


class Waker:
    def __init__(self, store: Store):
        self.store = store

    def run_once(self) -> int:
        woken = 0
        for _ in range(MAX_BATCHES):
            n = self.store.steps.task_wake_due(BATCH)
            woken += n
            if n < BATCH:
                break
        if woken:
            log.debug("woke suspended tasks", extra={"woken": woken})
        return woken

"""The worker's capacity: which runs this process holds, how many handlers are busy, and when
the claimer should look for work again.

Slots is the only code that touches the busy count, the runs and the gathering wait; the other
parts call its methods, each of which takes its one lock once. It runs no thread and does no
I/O: it is bookkeeping, so that every race over capacity is decided here, under one lock.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Sequence

from ..engine.model import ClaimedTask, Settlement, TaskDef
from .task_context import TaskContext


class Run:
    """One claimed task in this process, from claim to written outcome."""

    __slots__ = ("task", "ctx", "definition", "started", "handler_done", "given_up", "timed_out",
                 "settlement", "elapsed", "in_doubt")

    def __init__(self, task: ClaimedTask, ctx: TaskContext, definition: TaskDef | None):
        self.task, self.ctx, self.definition = task, ctx, definition
        self.started = time.monotonic()
        self.handler_done = False   # the handler returned or raised
        self.given_up = False       # released, abandoned or lost: the handler's outcome is dropped
        self.timed_out = False
        self.settlement: Settlement | None = None
        self.elapsed: float | None = None  # handler run time, observed when the outcome is written
        self.in_doubt = False  # a write of its outcome lost its answer: it may have been applied


class Slots:
    """`concurrency` slots; a run holds one from its claim until its handler returns or the run
    is given up, and stays held (for heartbeats) until its outcome is written."""

    def __init__(self, concurrency: int, claim_batch: int, poll_seconds: float,
                 stopping: threading.Event, inflight_gauge):
        self.concurrency, self.claim_batch, self.poll_seconds = concurrency, claim_batch, poll_seconds
        self._stopping = stopping
        self._inflight = inflight_gauge
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # a handler returned or a run was given up
        self._runs: dict[uuid.UUID, Run] = {}         # claimed, outcome not yet written
        self._busy = 0                                # handlers running (not given up)
        self._stuck = 0                               # abandoned sync handlers still holding a thread
        self._drained_at: float | None = None         # when a claim last found fewer tasks than it asked for
        self._refill_at: float | None = None          # ... and when a throttled group's bucket has a token again
        self._announced = 0                           # work announced (notifications, re-queued outcomes)
        self._gathering = False                       # the claimer waits in gather() ...
        # ... for this many free slots (a claim of at least half a batch)
        self._gather_wanted = max(1, min(claim_batch, concurrency) // 2)
        self.wake = threading.Event()                 # the claimer's: a slot was freed, or work was announced
        self._held_back = False                       # the last claim_limit was 0 for outcomes not yet written
        self.counts = {"claimed": 0, "settled": 0, "rejected": 0, "reclaimed": 0}

    # ---- the claimer --------------------------------------------------------------------------
    def claim_limit(self) -> tuple[int, int]:
        """How many tasks a claim may take now (0: none), and the announcement count it saw.
        After a claim that found the queues empty, the next waits for a notification, a re-queued
        outcome or the poll interval, not for a freed slot.

        A run whose handler returned frees its slot, but its outcome still waits for the writer:
        at most `concurrency` such runs may wait, and past that no claim is made until the
        writer catches up. Without the bound, a writer slower than the claims (a saturated
        database) let the claims in flight grow without end: rows left `running`, a heartbeat
        renewing tens of thousands of them in one statement that outlived its lease."""
        with self._lock:
            free = min(self.concurrency - self._busy, 2 * self.concurrency - len(self._runs))
            self._held_back = free <= 0 < self.concurrency - self._busy
            drained_at, refill_at = self._drained_at, self._refill_at
            announced = self._announced
        if self._stopping.is_set():
            return 0, announced
        now = time.monotonic()
        if (drained_at is not None and now - drained_at < self.poll_seconds
                and (refill_at is None or now < refill_at)):
            return 0, announced
        return max(0, min(free, self.claim_batch)), announced

    def claimed(self, runs: Sequence[Run], limit: int, announced: int, refill_in: float | None = None) -> None:
        """Hold the slots of a claim's runs (before any handler sees them), and note whether the
        claim found the queues empty; `refill_in`: the seconds until a group that a rate limit
        held back has a token again (the claimer looks then, not at the next poll)."""
        with self._lock:
            for run in runs:
                self._runs[run.task.id] = run
            self._busy += len(runs)
            self.counts["claimed"] += len(runs)
            self._inflight.set(len(self._runs))
            # work announced while the claim ran may be newer than its snapshot: not drained then
            drained = len(runs) < limit and announced == self._announced
            now = time.monotonic()
            self._drained_at = now if drained else None
            self._refill_at = now + refill_in if drained and refill_in is not None else None

    def wait_for_work(self) -> None:
        """The claimer's sleep between claims: until woken, or the poll interval (counted from
        the claim that found the queues empty)."""
        drained_at, refill_at = self._drained_at, self._refill_at
        if drained_at is None:
            timeout = self.poll_seconds
        else:
            until = drained_at + self.poll_seconds if refill_at is None else min(refill_at, drained_at + self.poll_seconds)
            timeout = max(0.0, until - time.monotonic())
        self.wake.wait(timeout)
        self.wake.clear()

    def gather(self, window: float = 0.005) -> None:
        """A slot was just freed: wait a few milliseconds for others, so that one claim fills many
        slots instead of one claim per task."""
        wanted = self._gather_wanted
        deadline = time.monotonic() + window
        with self._idle:
            if self._drained_at is not None:
                return  # the queues were empty: no claim is coming to fill the slots
            self._gathering = True
            try:
                while (self.concurrency - self._busy < wanted and self._busy > 0
                       and not self._stopping.is_set()):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._idle.wait(remaining)
            finally:
                self._gathering = False

    def look_again(self) -> None:
        """The next claim goes ahead even if the last one found the queues empty."""
        self._drained_at = None

    def announce(self) -> None:
        """Claimable work may exist: the claimer looks again now, not at the next poll."""
        with self._lock:
            self._announced += 1
            self._drained_at = None
        self.wake.set()

    def wake_claimer(self) -> None:
        if not self.wake.is_set():  # set() takes a lock and notifies: skip it when already set
            self.wake.set()

    # ---- handlers -----------------------------------------------------------------------------
    def handler_returned(self, run: Run) -> bool:
        """Free the slot of a run whose handler returned; False if the run was given up meanwhile
        (its outcome is to be dropped)."""
        with self._lock:
            if run.given_up:
                if run.timed_out:
                    self._stuck -= 1
                kept = False
            else:
                run.handler_done = True
                self._busy -= 1
                kept = True
            # wake the gathering claimer only once what it waits for is there, not per task
            if (self._gathering and (self.concurrency - self._busy >= self._gather_wanted or not self._busy)
                    or self._stopping.is_set()):
                self._idle.notify_all()
        return kept

    # ---- the completer ------------------------------------------------------------------------
    def written(self, runs: Sequence[Run], settled: int, rejected: int) -> None:
        """Let go of runs whose outcomes were written (or refused by their fence)."""
        with self._lock:
            for run in runs:
                self._runs.pop(run.task.id, None)
            self._inflight.set(len(self._runs))
            self.counts["settled"] += settled
            self.counts["rejected"] += rejected
            held_back, self._held_back = self._held_back, False
            # a limited run's written outcome frees room in its group, which a claim made before
            # the write did not see: look again now, not at the next poll
            freed_room = any(run.task.limited for run in runs)
            if freed_room:
                self._announced += 1
                self._drained_at = None
        if held_back or freed_room:  # the claimer waits for the writer: it may claim again
            self.wake_claimer()

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def holding(self) -> bool:
        """Whether an outcome is still to be written (a handler is running or returning)."""
        return bool(self._runs)

    def in_flight(self) -> int:
        return len(self._runs)

    # ---- the keeper ---------------------------------------------------------------------------
    def held(self) -> list[Run]:
        """The runs whose claims this worker still keeps alive."""
        with self._lock:
            return [r for r in self._runs.values() if not r.given_up]

    def lose(self, candidates: Iterable[Run]) -> list[Run]:
        """Give up the runs whose claims a heartbeat found gone; returns those it gave up (a run
        whose outcome was written between the heartbeat's snapshot and now is not lost)."""
        with self._lock:
            lost = [r for r in candidates if self._runs.get(r.task.id) is r and not r.given_up]
            for run in lost:
                run.given_up = True
                self._runs.pop(run.task.id, None)
                self._busy -= 1
            self._idle.notify_all()
        return lost

    def abandon_overdue(self, now: float, stuck_grace: float) -> list[Run]:
        """Ask every handler past its timeout to stop; give up the sync ones that ignored it for
        `stuck_grace` more seconds (their threads stay stuck). Returns those given up."""
        abandon = []
        with self._lock:
            for run in self._runs.values():
                d = run.definition
                if d is None or d.timeout is None or run.handler_done or run.given_up:
                    continue
                elapsed = now - run.started
                if elapsed >= d.timeout:
                    run.ctx.request_cancel()
                if elapsed >= d.timeout + stuck_grace and not d.is_async:
                    run.given_up = run.timed_out = True
                    self._busy -= 1
                    self._stuck += 1
                    abandon.append(run)
            self._idle.notify_all()
        return abandon

    @property
    def stuck(self) -> int:
        """Abandoned sync handlers still holding a thread."""
        return self._stuck

    # ---- shutdown -----------------------------------------------------------------------------
    @property
    def busy(self) -> int:
        return self._busy

    def wait_idle(self, deadline: float, urgent: threading.Event) -> None:
        """Let running handlers finish, until `deadline` or `urgent`."""
        with self._idle:
            while self._busy > 0 and not urgent.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._idle.wait(min(remaining, 0.05))

    def release_unfinished(self) -> list[Run]:
        """Give up every run whose handler has not returned; returns them."""
        with self._lock:
            runs = [r for r in self._runs.values() if not r.handler_done and not r.given_up]
            for run in runs:
                run.given_up = True
                self._busy -= 1
        return runs

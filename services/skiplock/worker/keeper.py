"""The keeper: keeps this worker's claims alive and its handlers within their timeouts.

On its own thread, a few times a second: it asks handlers past their timeout to stop, and
abandons sync ones that ignore it; on the heartbeat's period it renews every claim in one
statement (passing cancellations to handlers and giving up claims found lost), and renews this
worker's registry row; every SKIPLOCK_REAPER_SECONDS it runs the scheduler's reclaim of expired
leases, for installations without a scheduler, and twice a second the wake-up of suspended tasks. It never runs on the claim or settle path.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from ..engine.lifecycle import Stop
from ..engine.metrics import Metrics
from ..engine.outage import OUTAGE
from ..engine.reclaim import Reclaimer
from ..engine.store import Store
from ..engine.wake import WAKE_SECONDS, Waker
from .claimer import Claimer
from .completer import Completer
from .executor import retry_later
from .handler_threads import HandlerThreads
from .registration import Registration
from .slots import Slots
from .store_errors import DB_ERRORS, failed

log = logging.getLogger("skiplock.worker")


class Keeper:
    def __init__(self, store: Store, slots: Slots, completer: Completer, threads: HandlerThreads,
                 claimer: Claimer, registration: Registration, metrics: Metrics, stop: Stop, *,
                 lease_seconds: float, heartbeat_seconds: float, reclaim_seconds: float,
                 max_reclaims: int, stuck_grace_seconds: float):
        self.store, self.slots, self.completer, self.threads = store, slots, completer, threads
        self.claimer, self.registration, self.stop = claimer, registration, stop
        self.lease_seconds, self.heartbeat_seconds = lease_seconds, heartbeat_seconds
        self.reclaim_seconds, self.stuck_grace_seconds = reclaim_seconds, stuck_grace_seconds
        # the scheduler's reclaim service, run here as a fallback for installations without one
        self._reclaim = Reclaimer(store, metrics, max_reclaims)
        self._wake = Waker(store)  # suspended tasks whose time came (durable execution)
        self._registering = False  # keep a registry row (run() does; a worker driven by hand does not)
        self.exit_code = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        now = time.monotonic()
        self._next_beat = now + heartbeat_seconds
        self._next_reclaim = now + random.uniform(0, reclaim_seconds)  # replicas out of step
        self._next_wake = now + random.uniform(0, WAKE_SECONDS)
        self._next_registration = now  # at once, then on the heartbeat's period

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name="keeper", daemon=True)
        self._thread.start()
        return self._thread

    def stop_keeping(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        tick = min(0.25, self.heartbeat_seconds / 4)
        while not self._stop.wait(tick):
            self.run_once()

    def run_once(self, now: float | None = None) -> dict[str, int]:
        """One tick: timeouts always, and each periodic duty that is due at `now` (monotonic).
        Returns what it did."""
        now = time.monotonic() if now is None else now
        done = {"abandoned": self.time_out_once(now)}
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_seconds
            done["heartbeats"] = self.heartbeat_once()
        # not while the database looks unreachable: the beat would wait for a connection and
        # hold up the claims' heartbeats; the first beat after it answers again comes at once
        if now >= self._next_registration and self._registering and self.claimer.db_ok:
            self._next_registration = now + self.heartbeat_seconds
            done["registered"] = int(self.register_once())
        if now >= self._next_wake and not self.stop.is_set() and self.claimer.db_ok:
            self._next_wake = now + WAKE_SECONDS
            try:
                done["woken"] = self.wake_once()
            except DB_ERRORS as exc:
                self._unanswered()
                failed(log, "waking suspended tasks failed", "wake-up", exc)
        if now >= self._next_reclaim and not self.stop.is_set():
            self._next_reclaim = now + self.reclaim_seconds
            try:
                done["reclaimed"] = self.reclaim_once()
            except DB_ERRORS as exc:
                self._unanswered()
                failed(log, "reclaim failed", "reclaim", exc)
        return done

    def heartbeat_once(self) -> int:
        """Renew every claim held in one statement; returns how many the database still holds."""
        runs = self.slots.held()
        if not runs:
            return 0
        try:
            held = self.store.tasks.task_heartbeat([(r.task.id, r.task.lease_token, r.task.queue) for r in runs],
                                                   self.lease_seconds)
        except DB_ERRORS as exc:
            self.claimer.database_unanswered()
            failed(log, "heartbeat failed", "heartbeat", exc, claims=len(runs))
            return 0
        OUTAGE.answered()
        lost = []
        for run in runs:
            state = held.get(run.task.id)  # BUSY: held, not renewed this time (the next beat does)
            if state == "cancelling":
                run.ctx.request_cancel()
            elif state is None and not run.handler_done:
                lost.append(run)
        lost = self.slots.lose(lost) if lost else lost
        if lost:
            for run in lost:
                run.ctx.request_cancel()
            self.completer.reject("heartbeat", lost)
            self.slots.wake.set()  # their slots are free: claim into them now, not at the next poll
        return len(held)

    def start_registering(self) -> None:
        """Keep this worker's registry row from the next tick on (Worker.run; a worker driven by
        hand keeps none)."""
        self._registering = True

    @property
    def registering(self) -> bool:
        return self._registering

    def register_once(self) -> bool:
        """Insert or renew this worker's registry row with its in-flight count."""
        try:
            self.registration.beat(self.slots.in_flight())
            return True
        except DB_ERRORS as exc:
            self._unanswered()
            failed(log, "worker registry heartbeat failed", "registry", exc)
            return False

    def _unanswered(self) -> None:
        """A duty other than the claims' heartbeat failed on the database: the worker is unready
        now. Its duties run one after the other, so on a silent path the heartbeat would wait as
        long again for its own answer before saying so."""
        self.claimer.database_unanswered()

    def reclaim_once(self) -> int:
        """Expired leases back to their queues (the scheduler's reclaim); returns how many."""
        reclaimed = sum(self._reclaim.run_once().values())
        self.slots.count("reclaimed", reclaimed)
        if reclaimed:
            self.slots.wake.set()
        return reclaimed

    def wake_once(self) -> int:
        """Suspended tasks whose time came back to their queues; returns how many."""
        woken = self._wake.run_once()
        if woken:
            self.slots.wake.set()
        return woken

    def time_out_once(self, now: float) -> int:
        """Handlers past their timeout are asked to stop; a sync one that ignores it past the
        stuck grace is abandoned (retried later; a fresh thread takes its place). Returns how
        many were abandoned."""
        abandon = self.slots.abandon_overdue(now, self.stuck_grace_seconds)
        for run in abandon:
            log.error("handler ignored its timeout; abandoning its thread",
                      extra={"task_id": str(run.task.id), "kind": run.task.kind,
                             "timeout": run.definition.timeout, "stuck_threads": self.slots.stuck})
            run.settlement = retry_later(run, f"TimeoutError: timed out after {run.definition.timeout:g}s")
            self.completer.submit(run)
            self.threads.spawn(1)
        if abandon:
            self.slots.wake.set()
        if abandon and self.slots.stuck > max(1, self.slots.concurrency // 2):
            log.error("too many stuck handler threads; exiting for a clean restart",
                      extra={"stuck_threads": self.slots.stuck})
            self.exit_code = 3
            self.stop.set_urgent()  # no point draining threads that do not return
        return len(abandon)

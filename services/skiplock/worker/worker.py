"""The worker: claims tasks, runs their handlers, keeps their leases alive, writes their outcomes.

Threads, each with one job and one module:
  claimer (the caller of run()) - claimer.py: asks the slots for capacity and claims up to it in one
                                  statement, on a notification, a freed slot or every poll interval;
  N handler threads             - handler_threads.py: run sync handlers; async handlers run on one
                                  event-loop thread; executor.py turns each run into a Settlement;
  writer                        - completer.py: writes finished outcomes, many per round trip, fenced
                                  by lease, while the claimer claims (each has a connection of its own);
  keeper                        - keeper.py: heartbeats every claim in one statement, enforces
                                  timeouts, runs the reclaim fallback, and renews this worker's
                                  registry row on the heartbeat's period (registration.py);
  listener                      - listener.py: the LISTEN connection (none with SKIPLOCK_LISTEN=false:
                                  the claimer then polls);
  pod-cost                      - pod_cost.py: when SKIPLOCK_POD_DELETION_COST is on, keeps the pod's
                                  deletion cost near the in-flight count.
Shared state has one owner: slots.py holds the runs, the busy count and the claimer's wake-up;
the completer holds the outcome queue. The others call their methods.
No database transaction stays open while a handler runs, except one the handler asked for.

Shutdown (stop.requested): claim nothing more; let running handlers finish until the grace is
spent (or stop.urgent); then give the rest back ('released', no attempt consumed); flush; return.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid

from ..engine.errors import ConfigError
from ..engine.lifecycle import Stop
from ..engine.metrics import Metrics
from ..engine.outage import OUTAGE
from ..engine.registry import REGISTRY, Registry
from ..engine.settings import Settings, WorkerSettings
from ..engine.store import Store
from .claimer import Claimer
from .completer import Completer
from .executor import Executor, settlement
from .handler_threads import HandlerThreads
from .keeper import Keeper
from .listener import Listener
from .pod_cost import PodDeletionCost
from .registration import Registration
from .slots import Slots
from .store_errors import DB_ERRORS, short

log = logging.getLogger("skiplock.worker")

# The longest a stopping worker waits for a connection to delete its registry row. The row is a
# courtesy to operators (the maintenance deletes it three leases later), not worth a pod that
# outlives its termination grace while every connection slot of the database is taken.
REGISTRY_DELETE_WAIT = 2.0


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    queues: tuple[str, ...]
    concurrency: int
    lease_seconds: float
    heartbeat_seconds: float
    shutdown_grace_seconds: float
    poll_seconds: float
    reclaim_seconds: float
    max_reclaims: int
    claim_batch: int
    stuck_grace_seconds: float
    claim_lanes: int = 0              # SKIPLOCK_CLAIM_LANES: claims of one queue at once (0: no bound)
    listen: bool = True               # False: no LISTEN connection, a claim every poll interval
    listen_url: str | None = None     # None: the store's own URL
    max_children_per_run: int = 10_000  # SKIPLOCK_MAX_CHILDREN_PER_RUN

    @classmethod
    def from_settings(cls, settings: Settings | WorkerSettings) -> "WorkerConfig":
        s = WorkerSettings.of(settings)
        if s.listen and not s.listen_database_url and s.database_pooler == "transaction":
            # the pooler would hand the LISTEN to a server connection and then give that to others
            raise ConfigError("SKIPLOCK_DATABASE_POOLER=transaction: a worker cannot LISTEN through a "
                              "transaction pooler; set SKIPLOCK_LISTEN=false (poll only) or "
                              "SKIPLOCK_LISTEN_DATABASE_URL to a direct URL of the database")
        return cls(queues=s.queues, concurrency=s.concurrency, lease_seconds=s.lease_seconds,
                   heartbeat_seconds=s.heartbeat_seconds, shutdown_grace_seconds=s.shutdown_grace_seconds,
                   poll_seconds=s.poll_seconds, reclaim_seconds=s.reclaim_seconds,
                   max_reclaims=s.max_reclaims, claim_batch=s.claim_batch or s.concurrency,
                   stuck_grace_seconds=s.stuck_grace_seconds, listen=s.listen,
                   listen_url=s.listen_database_url, claim_lanes=s.claim_lanes,
                   max_children_per_run=s.max_children_per_run)


class Worker:
    """The wiring of the parts, and the shutdown contract."""

    def __init__(self, settings: Settings | WorkerSettings, store: Store, *, registry: Registry | None = None,
                 metrics: Metrics | None = None, stop: Stop | None = None, name: str | None = None):
        # the worker's variables, and no other (engine/settings: each Variable names its roles)
        self.settings = settings = WorkerSettings.of(settings)
        self.config = config = WorkerConfig.from_settings(settings)
        self.store = store
        self.registry = REGISTRY if registry is None else registry  # an empty Registry is falsy
        self.metrics = metrics or Metrics()
        self.stop = stop or Stop()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.log = log

        self.slots = Slots(config.concurrency, config.claim_batch, config.poll_seconds, self.stop.requested,
                           self.metrics.worker_inflight)
        self.stop.on_set(self.slots.wake.set)
        # a claim still waiting for its connection when the stop comes would hold up the drain
        self.stop.on_set(self._end_claim_waits)
        self.completer = Completer(store, self.slots, self.metrics, self.stop.urgent)
        self.threads = HandlerThreads(Executor(settings.tasks, config.stuck_grace_seconds), self.completer.accept)
        self.claimer = Claimer(store, self.slots, self.threads, self.registry, self.metrics, self.stop, self.name,
                               config.queues, config.lease_seconds, self.completer.pending, config.claim_lanes,
                               config.max_children_per_run)
        # this worker's row in skiplock.workers, written by the keeper while run() runs
        self.registration = Registration(store, settings, self.name, config.queues, config.concurrency,
                                         config.lease_seconds)
        self.keeper = Keeper(store, self.slots, self.completer, self.threads, self.claimer, self.registration,
                             self.metrics, self.stop, lease_seconds=config.lease_seconds,
                             heartbeat_seconds=config.heartbeat_seconds, reclaim_seconds=config.reclaim_seconds,
                             max_reclaims=config.max_reclaims, stuck_grace_seconds=config.stuck_grace_seconds)
        # built here, so that a missing client or configuration fails at startup
        self.pod_cost = (PodDeletionCost.from_settings(settings, self.slots.in_flight, self.metrics)
                         if settings.pod_deletion_cost else None)
        self.listener: Listener | None = None
        self._threads: list = []  # started by start() and joined by shutdown(), besides the keeper
        # the counters a dashboard or an alert reads exist at 0 from the start, not from their
        # first event: claims and the reclaim fallback's reclaims per queue, refused writes per operation
        for queue in config.queues:
            self.metrics.tasks_claimed.labels(queue)
            self.metrics.task_reclaims.labels(queue)
        for operation in ("completed", "failed", "retry", "step", "released", "heartbeat", "suspend", "step_record"):
            self.metrics.stale_writes_rejected.labels(operation)

    @property
    def counts(self) -> dict[str, int]:
        """Tasks claimed, settled, rejected (stale writes) and reclaimed by this worker."""
        return self.slots.counts

    @property
    def exit_code(self) -> int:
        return self.keeper.exit_code

    def ready(self) -> bool:
        return self.claimer.db_ok and not self.stop.is_set()

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "Worker":
        """Start every thread but the claimer and the writer (run() adds those)."""
        self.threads.start(self.config.concurrency,
                           with_event_loop=any(self.registry.get(k).is_async for k in self.registry.kinds()))
        self.keeper.start()
        if self.pod_cost is not None:
            self._threads.append(self.pod_cost.start(self.stop.requested))
        if self.config.listen:
            self.listener = Listener(self.config.listen_url or self.store.url, self.store.channel,
                                     self.claimer.on_notify, self.stop.requested,
                                     healthy_gauge=self.metrics.listener_healthy.labels(role="worker")).start()
        return self

    def unclaimed_kinds(self) -> dict[str, str]:
        """{kind: declared queue} of the registered kinds whose queue this worker does not claim."""
        found = {kind: self.registry.get(kind).queue for kind in self.registry.kinds()}
        return {kind: queue for kind, queue in found.items() if queue not in self.config.queues}

    def run(self) -> int:
        """Claim and run until stopped; then drain, release and return the exit code."""
        # what an outage's lines say this worker holds meanwhile (engine/outage.py)
        OUTAGE.held = lambda: {"claims": self.slots.in_flight(), "outcomes_pending": self.completer.pending()}
        OUTAGE.on_back = self.store.db.check_idle
        self.keeper.start_registering()  # the keeper's first tick inserts the row
        self.start()
        log.info("worker started", extra={"worker": self.name, "queues": list(self.config.queues),
                                           "concurrency": self.config.concurrency,
                                           "kinds": self.registry.kinds()})
        unclaimed = self.unclaimed_kinds()
        if unclaimed:
            # an enqueue without queue= puts these kinds in their declared queue: say so, not nothing
            log.warning("kinds declare queues this worker does not claim: their tasks wait for another worker "
                        "(add the queues to SKIPLOCK_QUEUES)",
                        extra={"kinds": unclaimed, "queues": list(self.config.queues)})
        self.completer.start()
        self.claimer.run()
        self.shutdown()
        return self.exit_code

    def run_once(self) -> int:
        """One step by hand (tests, embedding without run()): write the outcomes finished so far,
        then claim into the free slots. Returns how many tasks were claimed."""
        self.completer.run_once()
        self.slots.look_again()
        return self.claimer.run_once().claimed

    def shutdown(self) -> None:
        grace_end = time.monotonic() + self.config.shutdown_grace_seconds
        log.info("draining", extra={"running": self.slots.busy, "grace_seconds": self.config.shutdown_grace_seconds})
        self.slots.wait_idle(grace_end, self.stop.urgent)
        released = self.release_unfinished("worker shutting down")
        self.threads.stop(self.config.concurrency + self.slots.stuck)
        self.completer.stop_writer()
        # write every outcome we hold; the keeper keeps the leases alive meanwhile (a Postgres
        # outage at exit must not turn finished work into reclaims)
        self.completer.flush(time.monotonic()
                             + max(1.0, self.config.lease_seconds - self.config.shutdown_grace_seconds - 1))
        self.keeper.stop_keeping()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.keeper.registering:  # after the keeper stopped: no beat comes after the delete
            try:
                self.registration.remove(timeout=REGISTRY_DELETE_WAIT)
            except DB_ERRORS as exc:
                log.warning("could not remove this worker from the registry", extra={"error": short(exc)})
        if self.listener is not None:
            self.listener.join(timeout=2)  # it sees the stop flag within half a second
        self.threads.stop_event_loop()
        self.metrics.worker_inflight.set(0)
        log.info("worker stopped", extra={"released": released, **self.counts})

    def _end_claim_waits(self) -> None:
        self.store.db.end_claim_waits()

    def release_unfinished(self, reason: str) -> int:
        """Give every run whose handler is still running back to its queue ('released', no attempt
        consumed); their handlers are asked to stop, and their late outcomes dropped."""
        runs = self.slots.release_unfinished()
        for run in runs:
            run.ctx.request_cancel()
            self.threads.cancel(run)
            run.settlement = settlement(run, "released", error=None, message=None)
            self.completer.submit(run)
        if runs:
            log.info("released unfinished tasks", extra={"count": len(runs), "reason": reason})
        return len(runs)

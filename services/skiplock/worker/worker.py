"""The worker: claims tasks, runs their handlers, keeps their leases alive, writes their outcomes.

Threads, each with one job:
  claimer (the caller of run()) - claims up to the free slots in one statement, on a notification,
                                  a freed slot or every poll interval;
  N handler threads             - run sync handlers; async handlers run on one event-loop thread;
  writer                        - writes finished outcomes, many per round trip, fenced by lease,
                                  while the claimer claims (each has a connection of its own);
  keeper                        - heartbeats every claim in one statement, enforces timeouts, runs
                                  the reaper fallback, and renews this worker's registry row on the
                                  heartbeat's period (worker/registration.py);
  listener                      - LISTEN connection (worker/listener.py);
  pod-cost                      - when SKIPLOCK_POD_DELETION_COST is on, keeps the pod's deletion cost
                                  near the in-flight count (worker/pod_cost.py).
No database transaction stays open while a handler runs, except one the handler asked for.

Shutdown (stop.requested): claim nothing more; let running handlers finish until the grace is
spent (or stop.urgent); then give the rest back ('released', no attempt consumed); flush; return.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Sequence

import psycopg

from ..engine.errors import DatabaseUnavailable
from ..engine.registry import REGISTRY, Registry
from ..engine.lifecycle import Stop
from ..engine.logs import current_task, log_task_failed
from ..engine.metrics import Metrics, observe_many
from ..engine.model import ClaimedTask, Fail, Retry, Settlement, Step, TaskDef
from ..engine.retry import retry_delay
from ..engine.settings import Settings
from ..engine.store import Store
from ..scheduler.maintenance import Reaper
from .task_context import TaskContext
from .listener import Listener
from .pod_cost import PodDeletionCost
from .registration import Registration
from .tracebacks import bounded_traceback

log = logging.getLogger("skiplock.worker")

_DB_ERRORS = (DatabaseUnavailable, psycopg.Error)
# handler threads started before the first claim (see Worker.start)
_THREADS_AT_ONCE = 8


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    queues: tuple[str, ...]
    concurrency: int
    lease_seconds: float
    heartbeat_seconds: float
    shutdown_grace_seconds: float
    poll_seconds: float
    reaper_seconds: float
    max_reclaims: int
    claim_batch: int
    stuck_grace_seconds: float

    @classmethod
    def from_settings(cls, s: Settings) -> "WorkerConfig":
        return cls(queues=s.queues, concurrency=s.concurrency, lease_seconds=s.lease_seconds,
                   heartbeat_seconds=s.heartbeat_seconds, shutdown_grace_seconds=s.shutdown_grace_seconds,
                   poll_seconds=s.poll_seconds, reaper_seconds=s.reaper_seconds,
                   max_reclaims=s.max_reclaims, claim_batch=s.claim_batch or s.concurrency,
                   stuck_grace_seconds=s.stuck_grace_seconds)


class _Run:
    """One claimed task in this process, from claim to written outcome."""

    __slots__ = ("task", "ctx", "definition", "started", "handler_done", "given_up", "timed_out",
                 "settlement", "elapsed")

    def __init__(self, task: ClaimedTask, ctx: TaskContext, definition: TaskDef | None):
        self.task, self.ctx, self.definition = task, ctx, definition
        self.started = time.monotonic()
        self.handler_done = False   # the handler returned or raised
        self.given_up = False       # released, abandoned or lost: the handler's outcome is dropped
        self.timed_out = False
        self.settlement: Settlement | None = None
        self.elapsed: float | None = None  # handler run time, observed when the outcome is written


class _Handoff:
    """Claimed runs waiting for a handler thread.

    Waking a sleeping thread costs tens of microseconds and a GIL hand-over; waking one per task
    caps a worker at a few thousand short tasks a second. So at most one wake-up is in flight:
    the thread it wakes wakes the next only if work is still waiting when it takes its item.
    Short tasks are then run by the few threads already awake; slow tasks still spread over
    every thread, one wake-up after another.
    """

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._sleeping = 0
        self._waking = False

    def put(self, item) -> None:
        self.put_many((item,))

    def put_many(self, items) -> None:
        with self._cond:
            self._items.extend(items)
            self._wake_one()

    def get(self):
        with self._cond:
            while not self._items:
                self._sleeping += 1
                self._cond.wait()
                self._sleeping -= 1
                self._waking = False
            item = self._items.popleft()
            if self._items:
                self._wake_one()
            return item

    def _wake_one(self) -> None:
        if self._sleeping and not self._waking:
            self._waking = True
            self._cond.notify()


class Worker:
    def __init__(self, settings: Settings, store: Store, *, registry: Registry | None = None,
                 metrics: Metrics | None = None, stop: Stop | None = None, name: str | None = None):
        self.settings = settings
        self.config = WorkerConfig.from_settings(settings)
        self.store = store
        self.registry = registry or REGISTRY
        self.metrics = metrics or Metrics()
        self._reaper = Reaper(store, self.metrics, self.config.max_reclaims)
        self.stop = stop or Stop()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.log = log
        self.exit_code = 0

        self._lock = threading.Lock()
        self._runs: dict[uuid.UUID, _Run] = {}     # claimed, outcome not yet written
        self._busy = 0                              # handlers running (not abandoned)
        self._drained_at: float | None = None       # when a claim last found fewer tasks than it asked for
        self._announced = 0                         # work announced (notifications, re-queued outcomes)
        self._stuck = 0                             # abandoned sync handlers still holding a thread
        self._jobs = _Handoff()
        self._outcomes: collections.deque[_Run] = collections.deque()  # finished, to be written
        self._wake = threading.Event()              # claimer: a slot was freed, or work was announced
        self._outcome_ready = threading.Event()     # writer: an outcome is waiting
        self._writer_stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._async_futures: dict[uuid.UUID, asyncio.Future] = {}
        self._gathering = False                     # the claimer waits in _gather() ...
        # ... for this many free slots (a claim of at least half a batch)
        self._gather_wanted = max(1, min(self.config.claim_batch, self.config.concurrency) // 2)
        self._children: dict = {}
        self._keeper_stop = threading.Event()
        self._db_ok = False
        self.listener: Listener | None = None
        self.counts = {"claimed": 0, "settled": 0, "rejected": 0, "reclaimed": 0}
        # the counters a dashboard or an alert reads exist at 0 from the start, not from their
        # first event: claims and the reaper fallback's reclaims per queue, refused writes per operation
        for queue in self.config.queues:
            self.metrics.tasks_claimed.labels(queue)
            self.metrics.task_reclaims.labels(queue)
        for operation in ("completed", "failed", "retry", "step", "released", "heartbeat"):
            self.metrics.stale_writes_rejected.labels(operation)
        self.stop.on_set(self._wake.set)
        # written by the claim onto tasks enqueued without max_attempts: the number in force, which
        # the API shows without importing the handlers
        self._kind_max_attempts = {kind: self.registry.get(kind).max_attempts for kind in self.registry.kinds()}
        # built here, so that a missing client or configuration fails at startup
        self.pod_cost = (PodDeletionCost.from_settings(settings, lambda: len(self._runs), self.metrics)
                         if settings.pod_deletion_cost else None)
        # this worker's row in skiplock.workers, written by the keeper while run() runs
        self.registration = Registration(store, settings, self.name, self.config.queues,
                                         self.config.concurrency, self.config.lease_seconds)
        self._registering = False

    # ---- readiness -------------------------------------------------------------------------
    def ready(self) -> bool:
        return self._db_ok and not self.stop.is_set()

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Worker":
        # The first claim need not wait for every handler thread (100 take about 12 ms to start):
        # a few now, the rest beside the first claims. Claimed runs wait in the queue meanwhile.
        now = min(self.config.concurrency, _THREADS_AT_ONCE)
        self._spawn_handler_threads(now)
        if self.config.concurrency > now:
            threading.Thread(target=self._spawn_handler_threads, args=(self.config.concurrency - now,),
                             name="spawner", daemon=True).start()
        if any(self.registry.get(k).is_async for k in self.registry.kinds()):
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever, name="handlers-async",
                                                 daemon=True)
            self._loop_thread.start()
        keeper = threading.Thread(target=self._keeper, name="keeper", daemon=True)
        keeper.start()
        self._threads.append(keeper)
        if self.pod_cost is not None:
            self._threads.append(self.pod_cost.start(self.stop.requested))
        self.listener = Listener(self.store.url, self.store.channel, self._on_notify, self.stop.requested,
                                 healthy_gauge=self.metrics.listener_healthy.labels(role="worker")).start()
        return self

    def run(self) -> int:
        """Claim and run until stopped; then drain, release and return the exit code."""
        self._registering = True  # the keeper's first tick inserts the row
        self.start()
        log.info("worker started", extra={"worker": self.name, "queues": list(self.config.queues),
                                           "concurrency": self.config.concurrency,
                                           "kinds": self.registry.kinds()})
        writer = threading.Thread(target=self._write_loop, name="writer", daemon=True)
        writer.start()
        self._claim_loop()
        self.shutdown(writer)
        return self.exit_code

    def _claim_loop(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                claimed, full = self.claim_once()
                self._db_ok = True
                failures = 0
            except _DB_ERRORS as exc:
                self._db_ok = False
                failures += 1
                delay = random.uniform(0, min(15.0, 0.25 * 2**failures))
                log.warning("claim failed; retrying", extra={"error": _short(exc), "retry_in": round(delay, 2),
                                                             "outcomes_pending": len(self._outcomes)})
                self.stop.wait(delay)
                continue
            if claimed and full:
                continue  # a full batch: more is probably waiting
            drained_at = self._drained_at
            self._wake.wait(self.config.poll_seconds if drained_at is None
                            else max(0.0, drained_at + self.config.poll_seconds - time.monotonic()))
            self._wake.clear()
            self._gather()

    def _gather(self, window: float = 0.005) -> None:
        """A slot was just freed: wait a few milliseconds for others, so that one claim fills many
        slots instead of one claim per task."""
        wanted = self._gather_wanted
        deadline = time.monotonic() + window
        with self._idle:
            if self._drained_at is not None:
                return  # the queues were empty: no claim is coming to fill the slots
            self._gathering = True
            try:
                while (self.config.concurrency - self._busy < wanted and self._busy > 0
                       and not self.stop.is_set()):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._idle.wait(remaining)
            finally:
                self._gathering = False

    def run_once(self) -> int:
        """One step by hand (tests, embedding without run()): write the outcomes finished so far,
        then claim into the free slots. Returns how many tasks were claimed."""
        self.write_outcomes()
        self._drained_at = None
        return self.claim_once()[0]

    def claim_once(self) -> tuple[int, bool]:
        """One claim (one statement, one commit) into the free slots. Returns how many tasks were
        claimed, and whether that was all it asked for (more are probably waiting). After a claim
        that found the queues empty, the next one waits for a notification, a re-queued outcome or
        the poll interval, not for a freed slot."""
        with self._lock:
            free = self.config.concurrency - self._busy
            drained_at = self._drained_at
            announced = self._announced
        limit = 0 if self.stop.is_set() else max(0, min(free, self.config.claim_batch))
        if drained_at is not None and time.monotonic() - drained_at < self.config.poll_seconds:
            limit = 0
        if not limit:
            return 0, False
        tasks = self.store.claim(self.config.queues, limit, self.name, self.config.lease_seconds,
                                 self._kind_max_attempts)
        if tasks:
            self._dispatch(tasks)
        with self._lock:
            # work announced while the claim ran may be newer than its snapshot: not drained then
            drained = len(tasks) < limit and announced == self._announced
            self._drained_at = time.monotonic() if drained else None
        return len(tasks), len(tasks) == limit

    # ---- writing outcomes ------------------------------------------------------------------
    def _write_loop(self) -> None:
        """The writer: outcomes as they come, many per statement (those that finish while one is
        being written go in the next). Runs until shutdown(), whose flush() writes the rest."""
        failures = 0
        while not self._writer_stop.is_set():
            if not self._outcomes:
                self._outcome_ready.wait(1.0)
                self._outcome_ready.clear()
                continue
            failures = self._write_or_back_off(failures, 15.0, self._writer_stop.wait)

    def _write_or_back_off(self, failures: int, cap: float, pause) -> int:
        """write_outcomes(); on connection trouble, log and pause(seconds) for a jittered
        exponential backoff. Returns the count of failures in a row."""
        try:
            self.write_outcomes()
            return 0
        except _DB_ERRORS as exc:
            failures += 1
            delay = random.uniform(0, min(cap, 0.1 * 2**failures))
            log.warning("writing outcomes failed; retrying",
                        extra={"error": _short(exc), "retry_in": round(delay, 2), "pending": len(self._outcomes)})
            pause(delay)
            return failures

    def write_outcomes(self) -> int:
        """Write the outcomes finished so far in one statement; returns how many it took. On
        connection trouble they are kept (fenced: writing them late is safe) and it raises."""
        batch = self._take_outcomes()
        if not batch:
            return 0
        try:
            applied = self.store.settle([r.settlement for r in batch])
        except psycopg.DataError as exc:
            # one outcome the database refuses must not hold up the others
            self._settle_one_by_one(batch, exc)
            return len(batch)
        except BaseException:
            self._outcomes.extendleft(reversed(batch))
            raise
        self._record(batch, applied)
        if "queued" in applied.values():
            # a retry or step due now, or a release: the claimer may have stopped looking
            self._announce()
        return len(batch)

    def _take_outcomes(self, most: int = 1000) -> list[_Run]:
        batch = []
        try:
            while len(batch) < most:
                batch.append(self._outcomes.popleft())
        except IndexError:
            pass
        return batch

    def flush(self, deadline: float) -> None:
        """Write every outcome held (shutdown): retry through a database outage until `deadline`."""
        failures = 0
        while (self._outcomes or self._pending_outcomes()) and time.monotonic() < deadline:
            if not self._outcomes:
                time.sleep(0.01)  # an outcome is on its way (a handler is returning)
                continue
            failures = self._write_or_back_off(
                failures, 2.0, lambda delay: time.sleep(max(0.0, min(delay, deadline - time.monotonic()))))
            if failures and self.stop.urgent.is_set():
                return

    def shutdown(self, writer: threading.Thread | None = None) -> None:
        grace_end = time.monotonic() + self.config.shutdown_grace_seconds
        log.info("draining", extra={"running": self._busy, "grace_seconds": self.config.shutdown_grace_seconds})
        with self._idle:
            while self._busy > 0 and not self.stop.urgent.is_set():
                remaining = grace_end - time.monotonic()
                if remaining <= 0:
                    break
                self._idle.wait(min(remaining, 0.05))
        released = self._release_all("worker shutting down")
        for _ in range(self.config.concurrency + self._stuck):
            self._jobs.put(None)
        self._writer_stop.set()
        self._outcome_ready.set()
        if writer is not None:
            writer.join(timeout=2)  # flush() then writes what is left
        # write every outcome we hold; the keeper keeps the leases alive meanwhile (a Postgres
        # outage at exit must not turn finished work into reclaims)
        self.flush(time.monotonic() + max(1.0, self.config.lease_seconds - self.config.shutdown_grace_seconds - 1))
        self._keeper_stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._registering:  # after the keeper stopped: no beat comes after the delete
            try:
                self.registration.remove()
            except _DB_ERRORS as exc:
                log.warning("could not remove this worker from the registry", extra={"error": _short(exc)})
        if self.listener is not None:
            self.listener.join(timeout=2)  # it sees the stop flag within half a second
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self.metrics.worker_inflight.set(0)
        log.info("worker stopped", extra={"released": released, **self.counts})

    def _pending_outcomes(self) -> bool:
        with self._lock:
            return bool(self._runs)

    def _child(self, metric, *labels):
        """metric.labels(*labels), cached: labels() takes a lock and builds a tuple per call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # ---- dispatch and handlers -------------------------------------------------------------
    def _spawn_handler_threads(self, n: int) -> None:
        for _ in range(n):
            thread = threading.Thread(target=self._handler_loop, name="handler", daemon=True)
            thread.start()

    def _dispatch(self, tasks: list[ClaimedTask]) -> None:
        runs = []
        waits: dict[str, list[float]] = {}
        get_definition, store = self.registry.get, self.store
        for task in tasks:
            runs.append(_Run(task, TaskContext(task, store), get_definition(task.kind)))
            waited = task.waited_seconds
            waits.setdefault(task.queue, []).append(waited if waited > 0.0 else 0.0)
        for queue_name, queue_waits in waits.items():
            observe_many(self._child(self.metrics.task_wait, queue_name), queue_waits)
            self._child(self.metrics.tasks_claimed, queue_name).inc(len(queue_waits))
        with self._lock:
            for run in runs:
                self._runs[run.task.id] = run
            self._busy += len(runs)
            self.counts["claimed"] += len(runs)
            self.metrics.worker_inflight.set(len(self._runs))
        sync_runs = []
        for run in runs:
            if run.definition is not None and run.definition.is_async and self._loop is not None:
                future = asyncio.run_coroutine_threadsafe(self._run_async(run), self._loop)
                self._async_futures[run.task.id] = future
            else:
                sync_runs.append(run)
        if sync_runs:
            self._jobs.put_many(sync_runs)

    def _handler_loop(self) -> None:
        while True:
            run = self._jobs.get()
            if run is None:
                return
            outcome = self._call(run)
            self._handler_finished(run, outcome)
            if run.timed_out and run.given_up:
                return  # abandoned: a fresh thread took this one's place

    def _call(self, run: _Run) -> Settlement:
        task, definition = run.task, run.definition
        if definition is None:
            return self._settlement(run, "failed", error=f"no handler for task kind {task.kind!r} in this "
                                    f"worker (SKIPLOCK_TASKS={','.join(self.settings.tasks) or 'unset'})")
        running = current_task.set(task)  # stamps the handler's log records (engine/logs.py)
        try:
            value = definition.fn(run.ctx, task.payload)
        except BaseException as exc:  # noqa: BLE001 - a handler's failure is data, not a crash
            return self._failure(run, exc)
        finally:
            current_task.reset(running)
        return self._success(run, value)

    async def _run_async(self, run: _Run) -> None:
        task, definition = run.task, run.definition
        # this coroutine is an asyncio task of its own, with its own copy of the context
        current_task.set(task)
        try:
            if definition.timeout:
                value = await asyncio.wait_for(definition.fn(run.ctx, task.payload),
                                               definition.timeout + self.config.stuck_grace_seconds)
            else:
                value = await definition.fn(run.ctx, task.payload)
            outcome = self._success(run, value)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            outcome = self._failure(run, TimeoutError(f"timed out after {definition.timeout:g}s"))
        except BaseException as exc:  # noqa: BLE001
            outcome = self._failure(run, exc)
        self._async_futures.pop(task.id, None)
        self._handler_finished(run, outcome)

    def _success(self, run: _Run, value) -> Settlement:
        if value is None:  # the common case: nothing to encode or check
            return self._settlement(run, "completed", result=None)
        if isinstance(value, Step):
            return self._settlement(run, "step", cursor=value.cursor, progress=value.progress,
                                    message=value.message, delay=max(float(value.delay or 0), 0.0))
        try:
            encoded = _RESULT_JSON.encode(value)
        except (TypeError, ValueError) as exc:
            return self._settlement(run, "failed", error=f"handler result is not JSON-serializable: {exc}")
        if "\\u0000" in encoded:
            return self._settlement(run, "failed", error="handler result contains a NUL character (\\u0000), "
                                    "which Postgres jsonb cannot store")
        return self._settlement(run, "completed", result=value)

    def _failure(self, run: _Run, exc: BaseException) -> Settlement:
        # a Retry is a request, not an error: where it was raised tells an operator nothing
        trace = None if isinstance(exc, Retry) else bounded_traceback(exc, skip_file=__file__)
        if isinstance(exc, Fail):
            return self._settlement(run, "failed", error=(str(exc) or "failed").replace("\x00", "\\0"),
                                    traceback=trace)
        policy = run.definition.retry
        if isinstance(exc, Retry) and exc.delay is not None:
            delay = max(float(exc.delay), 0.0)
        else:
            delay = retry_delay(policy, run.task.attempt)
        error = f"{type(exc).__name__}: {exc}".replace("\x00", "\\0")  # text columns refuse NUL
        if not isinstance(exc, (Retry, TimeoutError)):
            log.warning("handler raised", extra={"task_id": str(run.task.id), "kind": run.task.kind,
                                                 "attempt": run.task.attempt, "error": error[:500],
                                                 "traceback": trace})
        return self._settlement(run, "retry", error=error[:4000], delay=delay, traceback=trace)

    def _settlement(self, run: _Run, outcome: str, **fields) -> Settlement:
        definition = run.definition
        return Settlement(task_id=run.task.id, lease_token=run.task.lease_token, outcome=outcome,
                          deadline_seconds=definition.retry.deadline if definition else None,
                          kind_max_attempts=definition.max_attempts if definition else None, **fields)

    def _handler_finished(self, run: _Run, settlement: Settlement) -> None:
        elapsed = time.monotonic() - run.started
        held = run.ctx.take_transaction()
        with self._lock:
            if run.given_up:
                if run.timed_out:
                    self._stuck -= 1
                dropped = True
            else:
                run.handler_done = True
                self._busy -= 1
                dropped = False
            # wake the gathering claimer only once what it waits for is there, not per task
            if (self._gathering and (self.config.concurrency - self._busy >= self._gather_wanted or not self._busy)
                    or self.stop.is_set()):
                self._idle.notify_all()
        if dropped:
            if held is not None:
                _rollback(held)
            log.info("late outcome dropped", extra={"task_id": str(run.task.id), "outcome": settlement.outcome})
            return
        run.elapsed = elapsed  # observed in _record, many at a time
        if held is not None:
            self._settle_in_transaction(run, settlement, held)
        else:
            run.settlement = settlement
            self._to_writer(run)
        if not self._wake.is_set():  # set() takes a lock and notifies: skip it when already set
            self._wake.set()

    def _to_writer(self, run: _Run) -> None:
        self._outcomes.append(run)
        if not self._outcome_ready.is_set():  # set() takes a lock and notifies: skip it when already set
            self._outcome_ready.set()

    def _settle_in_transaction(self, run: _Run, settlement: Settlement, held) -> None:
        """The handler used ctx.transaction(): write its outcome on that connection, commit both."""
        pool_cm, conn = held
        if settlement.outcome not in ("completed", "step"):
            _rollback(held)  # a failure undoes the handler's writes, then is recorded as usual
            run.settlement = settlement
            self._to_writer(run)
            return
        try:
            applied = self.store.settle([settlement], conn=conn)
            if applied:
                conn.commit()
            else:
                conn.rollback()
        except psycopg.Error as exc:
            _rollback(held, close=True)
            log.warning("transactional outcome failed; handler writes rolled back",
                        extra={"task_id": str(run.task.id), "error": _short(exc)})
            run.settlement = self._settlement(run, "retry", error=f"transaction failed: {_short(exc)}",
                                              delay=retry_delay(run.definition.retry, run.task.attempt))
            self._to_writer(run)
            return
        pool_cm.__exit__(None, None, None)
        run.settlement = settlement
        self._record([run], applied)

    def _settle_one_by_one(self, batch: list[_Run], cause: Exception) -> None:
        for run in batch:
            try:
                applied = self.store.settle([run.settlement])
            except psycopg.DataError as exc:
                log.error("the database refused an outcome; failing the task",
                          extra={"task_id": str(run.task.id), "error": _short(exc)})
                run.settlement = self._settlement(run, "failed", error=f"outcome not storable: {_short(exc)}")
                try:
                    applied = self.store.settle([run.settlement])
                except _DB_ERRORS as exc2:  # the lease will expire and the reaper takes over
                    log.error("could not record the failure", extra={"task_id": str(run.task.id),
                                                                      "error": _short(exc2)})
                    applied = {}
            except _DB_ERRORS:
                self._to_writer(run)  # connection trouble: back in line for the normal retry
                continue
            self._record([run], applied)

    def _record(self, runs: Sequence[_Run], applied: dict[uuid.UUID, str]) -> None:
        with self._lock:
            for run in runs:
                self._runs.pop(run.task.id, None)
            self.metrics.worker_inflight.set(len(self._runs))
        finished: dict[tuple[str, str, str], int] = {}
        durations: dict[tuple[str, str], list[float]] = {}
        settled = 0
        for run in runs:
            task = run.task
            if run.elapsed is not None:
                durations.setdefault((task.queue, task.kind), []).append(run.elapsed)
            state = applied.get(task.id)
            operation = run.settlement.outcome
            if state is None:
                self._reject(operation, run)
                continue
            if state == "failed":
                _log_failed(run)
            settled += 1
            key = (task.queue, task.kind, _outcome_label(operation, state))
            finished[key] = finished.get(key, 0) + 1
        with self._lock:  # the writer and handlers' own transactions both record
            self.counts["settled"] += settled
        for labels, n in finished.items():
            self._child(self.metrics.tasks_finished, *labels).inc(n)
        for labels, values in durations.items():
            observe_many(self._child(self.metrics.task_duration, *labels), values)

    def _reject(self, operation: str, run: _Run) -> None:
        with self._lock:
            self.counts["rejected"] += 1
        self.metrics.stale_writes_rejected.labels(operation).inc()
        log.warning("stale write rejected: the claim was lost",
                    extra={"task_id": str(run.task.id), "operation": operation,
                           "lease_token": run.task.lease_token})

    # ---- keeper: heartbeats, timeouts, reaper ---------------------------------------------
    def _keeper(self) -> None:
        next_beat = time.monotonic() + self.config.heartbeat_seconds
        next_reap = time.monotonic() + random.uniform(0, self.config.reaper_seconds)
        next_registry_beat = time.monotonic()  # at once, then on the heartbeat's period
        tick = min(0.25, self.config.heartbeat_seconds / 4)
        while not self._keeper_stop.wait(tick):
            now = time.monotonic()
            self._enforce_timeouts(now)
            if now >= next_beat:
                next_beat = now + self.config.heartbeat_seconds
                self.heartbeat_once()
            # not while the database looks unreachable: the beat would wait for a connection and
            # hold up the claims' heartbeats; the first beat after it answers again comes at once
            if now >= next_registry_beat and self._registering and self._db_ok:
                next_registry_beat = now + self.config.heartbeat_seconds
                self.registry_beat_once()
            if now >= next_reap and not self.stop.is_set():
                next_reap = now + self.config.reaper_seconds
                try:
                    self.reap_once()
                except _DB_ERRORS as exc:
                    log.warning("reaper failed", extra={"error": _short(exc)})

    def heartbeat_once(self) -> int:
        with self._lock:
            runs = [r for r in self._runs.values() if not r.given_up]
        if not runs:
            return 0
        try:
            held = self.store.heartbeat([(r.task.id, r.task.lease_token) for r in runs],
                                        self.config.lease_seconds)
        except _DB_ERRORS as exc:
            self._db_ok = False
            log.warning("heartbeat failed", extra={"error": _short(exc), "claims": len(runs)})
            return 0
        lost = []
        for run in runs:
            state = held.get(run.task.id)
            if state == "cancelling":
                run.ctx.request_cancel()
            elif state is None and not run.handler_done:
                lost.append(run)
        # a run whose outcome was written between our snapshot and the heartbeat is not lost
        with self._lock:
            lost = [r for r in lost if self._runs.get(r.task.id) is r and not r.given_up]
            for run in lost:
                run.given_up = True
                self._runs.pop(run.task.id, None)
                self._busy -= 1
            self._idle.notify_all()
        for run in lost:
            run.ctx.request_cancel()
            self._reject("heartbeat", run)
        if lost:
            self._wake.set()  # their slots are free: claim into them now, not at the next poll
        return len(held)

    def registry_beat_once(self) -> bool:
        """Insert or renew this worker's registry row with its in-flight count."""
        try:
            self.registration.beat(len(self._runs))
            return True
        except _DB_ERRORS as exc:
            log.warning("worker registry heartbeat failed", extra={"error": _short(exc)})
            return False

    def reap_once(self) -> int:
        """The scheduler's reaper, run by the keeper for installations without a scheduler."""
        reclaimed = sum(self._reaper.run_once().values())
        self.counts["reclaimed"] += reclaimed
        if reclaimed:
            self._wake.set()
        return reclaimed

    def _enforce_timeouts(self, now: float) -> None:
        abandon = []
        with self._lock:
            for run in self._runs.values():
                d = run.definition
                if d is None or d.timeout is None or run.handler_done or run.given_up:
                    continue
                elapsed = now - run.started
                if elapsed >= d.timeout:
                    run.ctx.request_cancel()
                if elapsed >= d.timeout + self.config.stuck_grace_seconds and not d.is_async:
                    run.given_up = run.timed_out = True
                    self._busy -= 1
                    self._stuck += 1
                    abandon.append(run)
            self._idle.notify_all()
        for run in abandon:
            log.error("handler ignored its timeout; abandoning its thread",
                      extra={"task_id": str(run.task.id), "kind": run.task.kind,
                             "timeout": run.definition.timeout, "stuck_threads": self._stuck})
            run.settlement = self._settlement(run, "retry", error=f"TimeoutError: timed out after "
                                              f"{run.definition.timeout:g}s",
                                              delay=retry_delay(run.definition.retry, run.task.attempt))
            self._to_writer(run)
            self._spawn_handler_threads(1)
        if abandon:
            self._wake.set()
        if abandon and self._stuck > max(1, self.config.concurrency // 2):
            log.error("too many stuck handler threads; exiting for a clean restart",
                      extra={"stuck_threads": self._stuck})
            self.exit_code = 3
            self.stop.set()
            self.stop.set()  # urgent: no point draining threads that do not return

    def _release_all(self, reason: str) -> int:
        with self._lock:
            runs = [r for r in self._runs.values() if not r.handler_done and not r.given_up]
            for run in runs:
                run.given_up = True
                self._busy -= 1
        for run in runs:
            run.ctx.request_cancel()
            future = self._async_futures.pop(run.task.id, None)
            if future is not None:
                future.cancel()
            run.settlement = self._settlement(run, "released", error=None, message=None)
            self._to_writer(run)
        if runs:
            log.info("released unfinished tasks", extra={"count": len(runs), "reason": reason})
        return len(runs)

    def _on_notify(self, payload: str | None) -> None:
        # a notification names the queue that got work; "*" (a resumed pause) and None (the
        # listener reconnected) mean "look everywhere"
        if payload is None or payload == "*" or payload in self.config.queues:
            self._announce()

    def _announce(self) -> None:
        """Claimable work may exist: the claimer looks again now, not at the next poll."""
        with self._lock:
            self._announced += 1
            self._drained_at = None
        self._wake.set()


# json.dumps(value, allow_nan=False) builds a new encoder per call; handlers' results share one.
_RESULT_JSON = json.JSONEncoder(allow_nan=False)


def _outcome_label(operation: str, state: str) -> str:
    if state in ("completed", "failed", "cancelled"):
        return state
    return {"retry": "retried", "step": "checkpoint", "released": "released"}.get(operation, operation)


def _log_failed(run: _Run) -> None:
    task = run.task
    log_task_failed(log, task_id=task.id, kind=task.kind, queue=task.queue, attempts=task.attempt,
                    error=run.settlement.error)


def _rollback(held, close: bool = False) -> None:
    pool_cm, conn = held
    try:
        conn.rollback()
    except Exception:
        close = True
    if close:
        try:
            conn.close()
        except Exception:
            pass
    try:
        pool_cm.__exit__(None, None, None)
    except Exception:
        pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]

"""The claimer: asks the slots how many tasks it may take, claims them in one statement (and, while
groups of limited tasks may have work, first in a claim of those: task_claim_limited, a
transaction of two statements), and hands them to the handler threads.

It claims on a notification, a freed slot or every poll interval, on a connection of its own
(the writer writes outcomes meanwhile on another). It runs on the thread that called
Worker.run(); after a stop it claims nothing more.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ..engine.lifecycle import Stop
from ..engine.metrics import Metrics, observe_many
from ..engine.outage import OUTAGE
from ..engine.registry import Registry
from ..engine.retry import failures_after
from ..engine.store import Store
from .handler_threads import HandlerThreads
from .slots import Run, Slots
from .store_errors import DB_ERRORS, failed
from .task_context import TaskContext

log = logging.getLogger("skiplock.worker")

# Rows a plain claim may read beyond its limit to park them, after one that parked some: a backlog
# of limited tasks leaves the plain claim's index in a few statements, so that the groups behind it
# are parked (and in the rotation) soon, not `limit` tasks per claim later.
PARK_BATCH = 1000

# After a claim that found every claim lane of a queue taken (SKIPLOCK_CLAIM_LANES): the pause
# before the next look, LANE_RETRY_FIRST doubled for each such claim in a row (the count falls by
# one each time the claimer goes back to waiting for work), at most LANE_RETRY_MAX, times a random
# 0.5-1.5 so that the workers turned away do not come back in step. While every lane is busy, the
# claims holding them take the work: the waiting workers lose no throughput, and their slots fill
# in one claim later instead of many small ones (shorter pauses measured slower:
# tests/benchmarks/RESULTS.md).
LANE_RETRY_FIRST, LANE_RETRY_MAX = 0.1, 1.0


class Claimed(NamedTuple):
    claimed: int  # tasks claimed
    asked: int    # the claim's limit (0: no claim was made)
    crowded: bool = False  # a queue was left out: every claim lane of it was taken

    @property
    def full(self) -> bool:
        """The claim got all it asked for: more is probably waiting."""
        return self.claimed > 0 and self.claimed == self.asked


class Claimer:
    def __init__(self, store: Store, slots: Slots, threads: HandlerThreads, registry: Registry,
                 metrics: Metrics, stop: Stop, owner: str, queues: Sequence[str], lease_seconds: float,
                 outcomes_pending: Callable[[], int], lanes: int = 0, max_children: int = 10_000):
        self.store, self.slots, self.threads, self.registry = store, slots, threads, registry
        self.stop, self.owner, self.queues, self.lease_seconds = stop, owner, tuple(queues), lease_seconds
        self.lanes = lanes  # SKIPLOCK_CLAIM_LANES (0: no bound)
        self.max_children = max_children  # SKIPLOCK_MAX_CHILDREN_PER_RUN, each run's ctx.enqueue bound
        self._outcomes_pending = outcomes_pending  # for the log line of a failed claim
        self._db_ok = False  # the database answered the last claim (readiness); written only here
        # written by the claim onto tasks enqueued without max_attempts: the number in force, which
        # the API shows without importing the handlers
        self._kind_max_attempts: Mapping[str, int] = {
            kind: registry.get(kind).max_attempts for kind in registry.kinds()}
        self._metrics = metrics
        # per queue, labelled at its first claim: labels() takes a lock and builds a tuple per call
        self._waited: dict = {}
        self._claimed: dict = {}
        # groups of parked (limited) tasks may have work: the last plain claim said so, or parked
        # some. Until then no claim of limited tasks is made: a worker without limits pays nothing.
        self._limited_work = True
        self._parking = False  # the last plain claim parked tasks: the next parks up to PARK_BATCH more

    @property
    def db_ok(self) -> bool:
        """Whether the database answered the last claim and no other duty found it silent since."""
        return self._db_ok

    def database_unanswered(self) -> None:
        """Another duty of this worker (the heartbeat, the registry) got no answer: unready until
        the next claim succeeds."""
        self._db_ok = False

    def run(self) -> None:
        """Claim until stopped."""
        failures = 0
        crowded_in_a_row = 0
        while not self.stop.is_set():
            try:
                result = self.run_once()
                self._db_ok = True
                failures = 0
                OUTAGE.answered()
            except DB_ERRORS as exc:
                self._db_ok = False
                if self.stop.is_set():
                    break  # a claim cut short by the stop (Database.end_claim_waits): nothing to retry
                failures = failures_after(failures, exc)
                delay = random.uniform(0, min(15.0, 0.25 * 2**failures))
                failed(log, "claim failed; retrying", "claim", exc, retry_in=round(delay, 2),
                       outcomes_pending=self._outcomes_pending())
                self.stop.wait(delay)
                continue
            if result.full:
                continue
            if result.crowded:
                # the queue has work that other claims are taking: look again in a moment. Not
                # sooner when a slot frees (it would ask for a lane again at once, in a loop).
                crowded_in_a_row += 1
                pause = min(LANE_RETRY_MAX, LANE_RETRY_FIRST * 2 ** (crowded_in_a_row - 1))
                self.stop.wait(pause * random.uniform(0.5, 1.5))
                continue
            crowded_in_a_row = max(0, crowded_in_a_row - 1)
            self.slots.wait_for_work()
            self.slots.gather()

    def run_once(self) -> Claimed:
        """One claim into the free slots: one statement and one commit, or, while groups of
        limited tasks may have work, first a claim of those (task_claim_limited, its own
        transaction) and then the plain claim for the slots left."""
        limit, announced = self.slots.claim_limit()
        if not limit:
            return Claimed(0, 0)
        tasks, refill_in, parked, crowded = [], None, 0, 0
        limited_first = self._limited_work
        if limited_first:
            tasks, refill_in = self._claim_limited(limit)
        if len(tasks) < limit:
            claim = self.store.tasks.task_claim(self.queues, limit - len(tasks), self.owner, self.lease_seconds,
                                                self._kind_max_attempts, PARK_BATCH if self._parking else 0,
                                                self.lanes)
            tasks += claim
            parked = claim.parked
            crowded = claim.crowded
            self._parking = parked > 0
            self._limited_work = claim.limited_work or parked > 0
            if not limited_first and self._limited_work and len(tasks) < limit:
                more, refill_in = self._claim_limited(limit - len(tasks))
                tasks += more
        runs = []
        waits: dict[str, list[float]] = {}
        get_definition, store = self.registry.get, self.store
        for task in tasks:
            runs.append(Run(task, TaskContext(task, store, self.max_children), get_definition(task.kind)))
            waited = task.waited_seconds
            waits.setdefault(task.queue, []).append(waited if waited > 0.0 else 0.0)
        for queue, queue_waits in waits.items():
            observe_many(self._labelled(self._waited, self._metrics.task_wait, queue), queue_waits)
            self._labelled(self._claimed, self._metrics.tasks_claimed, queue).inc(len(queue_waits))
        if crowded:
            self._metrics.claims_crowded.inc()
        # parked tasks are claimable at once by the limited claim, and a queue left out for its
        # lanes has work: neither is a sign of empty queues
        self.slots.claimed(runs, len(runs) if crowded else limit - parked, announced, refill_in)
        if runs:
            self.threads.dispatch(runs)
        return Claimed(len(runs) + parked, limit, crowded > 0)

    def _claim_limited(self, limit: int) -> tuple[list, float | None]:
        claim = self.store.tasks.task_claim_limited(self.queues, limit, self.owner, self.lease_seconds,
                                                    self._kind_max_attempts)
        return list(claim), claim.wake_in

    def on_notify(self, payload: str | None) -> None:
        """The listener's callback. A notification names the queue that got work; "*" (a resumed
        pause) and None (the listener reconnected) mean "look everywhere"."""
        if payload is None or payload == "*" or payload in self.queues:
            self.slots.announce()

    @staticmethod
    def _labelled(children: dict, metric, queue: str):
        child = children.get(queue)
        if child is None:
            child = children[queue] = metric.labels(queue)
        return child

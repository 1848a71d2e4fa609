"""The completer: takes each handler's Settlement and writes outcomes, many per statement.

It owns the outcome queue and the writer thread. Handler threads hand it what they return
(`accept`); the writer writes what gathered while the last statement ran (`run_once`), on its
own connection, fenced by each claim's lease token; shutdown writes the rest (`flush`). Every
outcome goes through one write path (`_write`): a refused batch is written again one outcome at
a time, and one refused alone is recorded as failed. Its one variant is a run's own transaction
(`_settle_in_transaction`: ctx.transaction(), or a suspension's writes), committed with it.
A failed write keeps its outcomes (fenced: late is safe) and is retried with backoff; one whose
row was held (BUSY: the settle never waits for a row lock) goes back in line.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import uuid
from collections.abc import Sequence

from ..engine.errors import ConnectionLost, DataRefused
from ..engine.metrics import Metrics
from ..engine.retry import failures_after
from ..engine.model import BUSY, Settlement
from ..engine.store import Store, translated_errors
from .executor import retry_later, settlement
from .held_transaction import HeldTransaction
from .outcome_records import OutcomeRecords
from .suspension import write_suspension
from .slots import Run, Slots
from .store_errors import DB_ERRORS, failed, short

log = logging.getLogger("skiplock.worker")

# outcomes per statement, at most
_BATCH = 1000
# how the failure that replaces an outcome the database refused begins
_NOT_STORABLE = "outcome not storable"

# How long the writer pauses after a write that found rows BUSY, doubling while it keeps finding
# some: another worker's claim statement holds such a row until it commits.
_BUSY_PAUSE, _BUSY_PAUSE_MAX = 0.001, 0.1


class Completer:
    def __init__(self, store: Store, slots: Slots, metrics: Metrics, urgent: threading.Event):
        self.store, self.slots, self.metrics = store, slots, metrics
        self._urgent = urgent
        self._outcomes: collections.deque[Run] = collections.deque()  # finished, to be written
        self._ready = threading.Event()   # the writer's: an outcome is waiting
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._records = OutcomeRecords(metrics, slots)
        self._busy_rounds = 0  # writes in a row that found rows BUSY

    def reject(self, operation: str, runs: Sequence[Run]) -> None:
        """Count and log writes of `operation` that found their claims lost (the keeper's)."""
        self._records.reject(operation, runs)

    # ---- what handlers return -----------------------------------------------------------------
    def accept(self, run: Run, outcome: Settlement) -> None:
        """A handler returned `outcome` (on its thread): free its slot and queue the outcome, or
        write it on the handler's own transaction."""
        elapsed = time.monotonic() - run.started
        held = run.ctx.take_transaction()
        if not self.slots.handler_returned(run):
            if held is not None:
                held.rollback()
            if outcome.outcome == "step_record":
                # a step's record the fence refused is a stale write, even when a heartbeat found
                # the claim lost first (then nothing else of this run is written)
                self._records.refused("step_record", run)
            else:
                log.info("late outcome dropped", extra={"task_id": str(run.task.id), "outcome": outcome.outcome})
            return
        run.elapsed = elapsed  # observed when its outcome is recorded, many at a time
        if outcome.outcome == "step_record":  # refused already: nothing to write
            if held is not None:
                held.rollback()
            run.settlement = outcome
            self._records.record([run], {})
        elif held is not None or outcome.outcome == "suspend":
            self._settle_in_transaction(run, outcome, held)
        else:
            run.settlement = outcome
            self.submit(run)
        self.slots.wake_claimer()

    def submit(self, run: Run) -> None:
        """Queue `run.settlement` for the writer."""
        self._outcomes.append(run)
        if not self._ready.is_set():  # set() takes a lock and notifies: skip it when already set
            self._ready.set()

    def pending(self) -> int:
        return len(self._outcomes)

    # ---- the writer ---------------------------------------------------------------------------
    def start(self) -> None:
        self._writer = threading.Thread(target=self._write_loop, name="writer", daemon=True)
        self._writer.start()

    def stop_writer(self, timeout: float = 2.0) -> None:
        """Stop the writer thread (flush() then writes what is left)."""
        self._stop.set()
        self._ready.set()
        if self._writer is not None:
            self._writer.join(timeout=timeout)

    def _write_loop(self) -> None:
        """Outcomes as they come, many per statement (those that finish while one is being
        written go in the next)."""
        failures = 0
        while not self._stop.is_set():
            if not self._outcomes:
                self._ready.wait(1.0)
                self._ready.clear()
                continue
            failures = self._write_or_back_off(failures, 15.0, self._stop.wait)
            if self._busy_rounds:
                self._stop.wait(self.busy_pause())

    def _write_or_back_off(self, failures: int, cap: float, pause) -> int:
        """run_once(); on connection trouble, log and pause(seconds) for a jittered exponential
        backoff. Returns the count of failures in a row."""
        try:
            self.run_once()
            return 0
        except DB_ERRORS as exc:
            failures = failures_after(failures, exc)
            delay = random.uniform(0, min(cap, 0.1 * 2**failures))
            failed(log, "writing outcomes failed; retrying", "outcomes", exc, retry_in=round(delay, 2),
                   pending=len(self._outcomes))
            pause(delay)
            return failures

    def run_once(self) -> int:
        """Write the outcomes finished so far in one statement; returns how many it took. On
        connection trouble they are kept and it raises."""
        batch = self._take()
        if batch:
            self._write(batch)
        return len(batch)

    def _write(self, batch: list[Run]) -> None:
        """The one write path: task_settle of the batch, rows found BUSY back in line, the rest
        recorded. On connection trouble the batch goes back to the front of the line and this
        raises (fenced: writing it late is safe)."""
        try:
            applied = self._settle(batch)
        except DataRefused as exc:
            # one outcome the database refuses must not hold up the others
            if len(batch) > 1:
                self._write_each(batch)
            else:
                self._write_failure(batch[0], exc)
            return
        except BaseException:
            self._outcomes.extendleft(reversed(batch))
            raise
        self._records.record(self._put_back_busy(batch, applied), applied)
        if "queued" in applied.values():
            # a retry or step due now, or a release: the claimer may have stopped looking
            self.slots.announce()

    def _write_each(self, batch: list[Run]) -> None:
        """A refused batch, one outcome per statement; on connection trouble the rest go back in
        line after the one that failed."""
        for i, run in enumerate(batch):
            try:
                self._write([run])
            except BaseException:
                for position, rest in enumerate(batch[i + 1:], 1):
                    self._outcomes.insert(position, rest)
                raise

    def _write_failure(self, run: Run, exc: DataRefused) -> None:
        """An outcome the database refuses on its own: the task fails with the reason instead.
        If even that is refused, the run is let go and its lease expires (a reclaim takes over)."""
        if run.settlement.outcome == "failed" and (run.settlement.error or "").startswith(_NOT_STORABLE):
            log.error("could not record the failure", extra={"task_id": str(run.task.id), "error": short(exc)})
            self._records.record([run], {})
            return
        log.error("the database refused an outcome; failing the task",
                  extra={"task_id": str(run.task.id), "error": short(exc)})
        run.settlement = settlement(run, "failed", error=f"{_NOT_STORABLE}: {short(exc)}")
        self._write([run])

    def _settle(self, batch: list[Run]) -> dict[uuid.UUID, str]:
        """task_settle of the batch's outcomes. A connection lost before the answer came leaves
        each in doubt: the statement may have been applied. Written again, an outcome the fence
        refuses may be the one that stands; those found standing count as written."""
        try:
            applied = self.store.tasks.task_settle([r.settlement for r in batch])
        except ConnectionLost:
            for run in batch:
                run.in_doubt = True
            raise
        doubted = [r for r in batch if r.in_doubt and r.task.id not in applied]
        if doubted:
            try:
                stands = self.store.tasks.task_outcome_stands([(r.task.id, r.task.lease_token) for r in doubted])
            except DB_ERRORS as exc:  # then counted as refused, which they were, this time
                log.warning("could not tell whether refused outcomes were written before",
                            extra={"error": short(exc), "outcomes": len(doubted)})
                stands = {}
            for run in doubted:
                if run.task.id in stands:
                    log.info("outcome already written; the answer to its write was lost",
                             extra={"task_id": str(run.task.id), "state": stands[run.task.id]})
            applied.update(stands)
        return applied

    def flush(self, deadline: float) -> None:
        """Write every outcome held (shutdown): retry through a database outage until `deadline`,
        or until the first failure once the stop is urgent."""
        failures = 0
        while (self._outcomes or self.slots.holding()) and time.monotonic() < deadline:
            if not self._outcomes:
                time.sleep(0.01)  # an outcome is on its way (a handler is returning)
                continue
            failures = self._write_or_back_off(
                failures, 2.0, lambda delay: time.sleep(max(0.0, min(delay, deadline - time.monotonic()))))
            if failures and self._urgent.is_set():
                return
            if self._busy_rounds:
                time.sleep(max(0.0, min(self.busy_pause(), deadline - time.monotonic())))

    def busy_pause(self) -> float:
        """The pause before writing again, after writes that found rows BUSY."""
        return min(_BUSY_PAUSE_MAX, _BUSY_PAUSE * 2 ** self._busy_rounds)

    def _put_back_busy(self, batch: list[Run], applied: dict[uuid.UUID, str]) -> list[Run]:
        """The runs whose rows were BUSY go back in line (nothing was written for them); returns
        the others."""
        busy = [r for r in batch if applied.get(r.task.id) == BUSY]
        if not busy:
            self._busy_rounds = 0
            return batch
        self._busy_rounds += 1
        self._outcomes.extend(busy)
        self._records.count_busy(busy)
        return [r for r in batch if applied.get(r.task.id) != BUSY]

    def _take(self) -> list[Run]:
        batch = []
        try:
            while len(batch) < _BATCH:
                batch.append(self._outcomes.popleft())
        except IndexError:
            pass
        return batch

    def _settle_in_transaction(self, run: Run, outcome: Settlement, held: HeldTransaction | None) -> None:
        """The handler used ctx.transaction(), or suspended (a wait's writes and its outcome are
        one transaction, the run's own if it has one): write its outcome there, commit both."""
        try:
            held = held or HeldTransaction(self.store)
        except DB_ERRORS as exc:
            run.settlement = retry_later(run, f"transaction failed: {short(exc)}")
            self.submit(run)
            return
        conn = held.conn
        if outcome.outcome not in ("completed", "step", "suspend"):
            held.rollback()  # a failure undoes the handler's writes, then is recorded as usual
            run.settlement = outcome
            self.submit(run)
            return
        try:
            with translated_errors(conn):
                if outcome.outcome == "suspend":
                    outcome = write_suspension(self.store, conn, run.task, run.ctx.suspension, outcome)
                applied = {} if outcome is None else held.settle(
                    self.store, outcome, lambda: self._records.count_busy([run]))
                if applied:
                    conn.commit()
                else:
                    conn.rollback()
        except DB_ERRORS as exc:
            held.rollback(close=True)
            if isinstance(exc, ConnectionLost):
                # the COMMIT may have been applied, the handler's writes with the outcome: the retry
                # below is then refused by its fence, and found standing (_settle)
                run.in_doubt = True
                log.warning("connection lost while writing a transactional outcome; written again",
                            extra={"task_id": str(run.task.id), "error": short(exc)})
            else:
                log.warning("transactional outcome failed; handler writes rolled back",
                            extra={"task_id": str(run.task.id), "error": short(exc)})
            run.settlement = retry_later(run, f"transaction failed: {short(exc)}")
            self.submit(run)
            return
        held.release()
        run.settlement = outcome if outcome is not None else settlement(run, "step_record")
        self._records.record([run], applied)
        if "queued" in applied.values():
            self.slots.announce()  # a suspension whose wait was over already

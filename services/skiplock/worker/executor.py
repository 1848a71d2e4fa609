"""Runs one handler and turns what it did into a Settlement: the outcome the completer writes.

The executor touches no shared state (no slots, no queue, no store): it is called on a handler
thread, or awaited on the event-loop thread, and only returns. A handler's failure is data here,
never a crash of the thread that ran it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from ..engine.logs import current_task
from ..engine.model import Fail, Retry, Settlement, Step
from ..engine.payload_types import TypedTaskDef, handler_payload
from ..engine.retry import retry_delay
from ..engine.tracing import task_run
from .durable import ClaimLost, Suspend
from .slots import Run
from .tracebacks import bounded_traceback

log = logging.getLogger("skiplock.worker")

# json.dumps(value, allow_nan=False) builds a new encoder per call; handlers' results share one.
_RESULT_JSON = json.JSONEncoder(allow_nan=False)


class Executor:
    def __init__(self, task_modules: Sequence[str], stuck_grace_seconds: float):
        self.task_modules = tuple(task_modules)  # named in the error of a kind without a handler
        self.stuck_grace_seconds = stuck_grace_seconds

    def run(self, run: Run) -> Settlement:
        """Call a sync handler (on the calling thread)."""
        task, definition = run.task, run.definition
        if definition is None:
            return settlement(run, "failed", error=f"no handler for task kind {task.kind!r} in this "
                              f"worker (SKIPLOCK_TASKS={','.join(self.task_modules) or 'unset'})")
        running = current_task.set(task)  # stamps the handler's log records (engine/logs.py)
        with task_run(task) as span:  # a no-op unless a tracer provider is set (engine/tracing.py)
            try:
                payload = task.payload
                if isinstance(definition, TypedTaskDef):
                    payload = handler_payload(definition, payload)
                value = definition.fn(run.ctx, payload)
            except (Suspend, ClaimLost) as exc:
                return span.settled(_durable_end(run, exc))
            except BaseException as exc:  # noqa: BLE001 - a handler's failure is data, not a crash
                return span.settled(self._failure(run, exc), exc, retry_asked=isinstance(exc, Retry))
            finally:
                current_task.reset(running)
            return span.settled(self._success(run, value))

    async def run_async(self, run: Run) -> Settlement:
        """Await an async handler; past its timeout and the stuck grace, it is cancelled."""
        task, definition = run.task, run.definition
        # this coroutine is an asyncio task of its own, with its own copy of the context
        current_task.set(task)
        with task_run(task) as span:
            try:
                payload = task.payload
                if isinstance(definition, TypedTaskDef):
                    payload = handler_payload(definition, payload)
                if definition.timeout:
                    value = await asyncio.wait_for(definition.fn(run.ctx, payload),
                                                   definition.timeout + self.stuck_grace_seconds)
                else:
                    value = await definition.fn(run.ctx, payload)
                return span.settled(self._success(run, value))
            except (Suspend, ClaimLost) as exc:
                return span.settled(_durable_end(run, exc))
            except (asyncio.TimeoutError, asyncio.CancelledError):
                timeout = TimeoutError(f"timed out after {definition.timeout:g}s")
                return span.settled(self._failure(run, timeout), timeout)
            except BaseException as exc:  # noqa: BLE001
                return span.settled(self._failure(run, exc), exc, retry_asked=isinstance(exc, Retry))

    def _success(self, run: Run, value) -> Settlement:
        if value is None:  # the common case: nothing to encode or check
            return settlement(run, "completed", result=None)
        if isinstance(value, Step):
            return settlement(run, "step", cursor=value.cursor, progress=value.progress,
                              message=value.message, delay=max(float(value.delay or 0), 0.0))
        try:
            encoded = _RESULT_JSON.encode(value)
        except (TypeError, ValueError) as exc:
            return settlement(run, "failed", error=f"handler result is not JSON-serializable: {exc}")
        if "\\u0000" in encoded:
            return settlement(run, "failed", error="handler result contains a NUL character (\\u0000), "
                              "which Postgres jsonb cannot store")
        return settlement(run, "completed", result=value)

    def _failure(self, run: Run, exc: BaseException) -> Settlement:
        # a Retry is a request, not an error: where it was raised tells an operator nothing
        trace = None if isinstance(exc, Retry) else bounded_traceback(exc, skip_file=__file__)
        if isinstance(exc, Fail):
            return settlement(run, "failed", error=(str(exc) or "failed").replace("\x00", "\\0"),
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
        return settlement(run, "retry", error=error[:4000], delay=delay, traceback=trace)


def _durable_end(run: Run, exc: BaseException) -> Settlement:
    """A wait that ended the run (the completer writes it with its record), or a record refused
    by its fence: nothing more is written for this run (counted as a stale write)."""
    if isinstance(exc, Suspend):
        return settlement(run, "suspend", suspended=exc.reason)
    log.warning("stale write rejected: a step's record", extra={"task_id": str(run.task.id), "error": str(exc)})
    return settlement(run, "step_record")


def settlement(run: Run, outcome: str, **fields) -> Settlement:
    """The outcome `outcome` of `run`, fenced by its lease token."""
    definition = run.definition
    return Settlement(task_id=run.task.id, lease_token=run.task.lease_token, outcome=outcome,
                      deadline_seconds=definition.retry.deadline if definition else None,
                      kind_max_attempts=definition.max_attempts if definition else None, queue=run.task.queue,
                      **fields)


def retry_later(run: Run, error: str) -> Settlement:
    """A retry after the kind's backoff, for a run the worker itself failed (timeout, lost
    transaction)."""
    return settlement(run, "retry", error=error, delay=retry_delay(run.definition.retry, run.task.attempt))

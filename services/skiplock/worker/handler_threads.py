"""The threads that run handlers: N threads for sync handlers, one event loop for async ones.

Each takes a claimed run, has the executor turn it into a Settlement, and hands both to
`on_finished` (the completer). They own the handoff queue, the event loop and the futures of
the async runs; they never touch the slots.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from collections.abc import Callable, Sequence

from ..engine.model import Settlement
from .executor import Executor
from .slots import Run

# handler threads started before the first claim (see HandlerThreads.start)
_THREADS_AT_ONCE = 8


class Handoff:
    """Claimed runs waiting for a handler thread.

    Waking a sleeping thread costs a context switch and a GIL hand-over; waking one per task
    would cap a worker's rate of short tasks. So at most one wake-up is in flight: the thread it
    wakes wakes the next only if work is still waiting when it takes its item. Short tasks are
    then run by the few threads already awake; slow tasks still spread over every thread, one
    wake-up after another.
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


class HandlerThreads:
    def __init__(self, executor: Executor, on_finished: Callable[[Run, Settlement], None]):
        self.executor = executor
        self.on_finished = on_finished
        self._jobs = Handoff()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_futures: dict[uuid.UUID, asyncio.Future] = {}

    def start(self, concurrency: int, with_event_loop: bool) -> None:
        # The first claim need not wait for every handler thread (starting a hundred takes a
        # while): a few now, the rest beside the first claims. Claimed runs wait in the queue.
        now = min(concurrency, _THREADS_AT_ONCE)
        self.spawn(now)
        if concurrency > now:
            threading.Thread(target=self.spawn, args=(concurrency - now,), name="spawner", daemon=True).start()
        if with_event_loop:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="handlers-async", daemon=True).start()

    def spawn(self, n: int) -> None:
        """Start `n` more sync handler threads (one replaces each abandoned one)."""
        for _ in range(n):
            threading.Thread(target=self._handler_loop, name="handler", daemon=True).start()

    def dispatch(self, runs: Sequence[Run]) -> None:
        sync_runs = []
        for run in runs:
            if run.definition is not None and run.definition.is_async and self._loop is not None:
                future = asyncio.run_coroutine_threadsafe(self._run_async(run), self._loop)
                self._async_futures[run.task.id] = future
            else:
                sync_runs.append(run)
        if sync_runs:
            self._jobs.put_many(sync_runs)

    def cancel(self, run: Run) -> None:
        """Cancel an async run's coroutine (a sync handler can only be asked, through its ctx)."""
        future = self._async_futures.pop(run.task.id, None)
        if future is not None:
            future.cancel()

    def stop(self, threads: int) -> None:
        """Each of `threads` sync threads returns once it takes its stop item."""
        for _ in range(threads):
            self._jobs.put(None)

    def stop_event_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _handler_loop(self) -> None:
        while True:
            run = self._jobs.get()
            if run is None:
                return
            self.on_finished(run, self.executor.run(run))
            if run.timed_out and run.given_up:
                return  # abandoned: a fresh thread took this one's place

    async def _run_async(self, run: Run) -> None:
        outcome = await self.executor.run_async(run)
        self._async_futures.pop(run.task.id, None)
        self.on_finished(run, outcome)

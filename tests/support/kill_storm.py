"""The worker processes of a kill storm (tests/reliability/test_durable_faults.py,
tests/distributed/test_distributed_faults.py): spawned, one
SIGKILLed about every second while it holds a claim, and replaced at once, as
tests/reliability/test_kill9.py does by hand.

A replacement is not waited for before the next kill (a worker takes about a second to be ready,
which would halve the pace); `ready()` waits for all of them once the storm is over.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Sequence

from .harness import ProcessGroup, Proc, wait_for


class Workers:
    def __init__(self, processes: ProcessGroup, db_url: str, db, size: int, env: dict, tasks: str,
                 concurrency: int = 4, args: Sequence[str] = ()):
        self.processes, self.db_url, self.db = processes, db_url, db
        self.env, self.tasks, self.concurrency, self.args = env, tasks, concurrency, tuple(args)
        self.live: list[Proc] = [self.spawn() for _ in range(size)]
        for proc in self.live:
            processes.wait_ready(proc)
        self.killed: list[int] = []

    def spawn(self) -> Proc:
        return self.processes.spawn(self.db_url, "--concurrency", str(self.concurrency), *self.args,
                                    tasks=self.tasks, env=self.env)

    def holding(self, task_ids: Sequence | None = None) -> list[Proc]:
        """The live workers that hold a claim now (of one of `task_ids`, when given)."""
        pids = {row[0] for row in self.db.execute(
            "SELECT DISTINCT split_part(lease_owner, ':', 2)::int FROM skiplock.tasks "
            "WHERE state IN ('running', 'cancelling') AND lease_owner IS NOT NULL "
            "AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))",
            {"ids": list(task_ids) if task_ids is not None else None}).fetchall()}
        return [proc for proc in self.live if proc.pid in pids and proc.alive()]

    def kill(self, victim: Proc) -> None:
        """SIGKILL `victim` and start its replacement."""
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        self.killed.append(victim.pid)
        self.live.remove(victim)
        self.live.append(self.spawn())

    def kill_holder(self, task_ids: Sequence | None = None, rng: random.Random | None = None,
                    stop: Callable[[], bool] = lambda: False, timeout: float = 10) -> Proc | None:
        """Kill a worker that holds a claim (of one of `task_ids`) as soon as one does; None if
        `stop()` came first."""
        holders = wait_for(lambda: self.holding(task_ids) or stop(), timeout, interval=0.01,
                           message="a worker to hold a claim")
        if holders is True:
            return None
        victim = (rng or random).choice(holders)
        self.kill(victim)
        return victim

    def storm(self, kills: int, done: Callable[[], bool], rng: random.Random,
              task_ids: Sequence | None = None) -> int:
        """Up to `kills` kills, one about every second, each of a worker holding a claim, until
        `done()`; returns how many were made."""
        made = 0
        for _ in range(kills):
            time.sleep(1.0)  # a kill about every second: the pace is the scenario, not a wait
            if done() or self.kill_holder(task_ids, rng, stop=done) is None:
                break
            made += 1
        return made

    def ready(self) -> None:
        """Every live worker answers /readyz (the replacements included)."""
        for proc in self.live:
            self.processes.wait_ready(proc)

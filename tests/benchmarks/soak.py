"""Soak: does the database stay bounded at a sustained rate? (issue 19, "Bounded at scale")

    python -m tests.benchmarks.soak [--minutes 30] [--interval 60] [--rate R | --rate-fraction 0.6]
                                    [--warmup-minutes 2] [--json PATH]

Starts a Postgres of its own with Postgres's default settings (autovacuum on, fsync and synchronous
commit on: tests/pgcluster.py's ThrowawayCluster with run.py's BENCH_SERVER_SETTINGS), migrates
it, and runs one real `skiplock worker` and one `skiplock scheduler` process; completed tasks are
kept 30 s and retention runs every 5 s. Unless `--rate` is given it first measures the worker's
drain rate (a backlog of `--drain-tasks` no-op tasks) and then enqueues at `--rate-fraction` of it,
steadily (a batch every 0.1 s, through `enqueue_many`) for `--minutes`.

Every `--interval` seconds it records:
- throughput: tasks completed in the interval per second (their `completed` events, read every
  few seconds, long before retention deletes them);
- backlog: tasks queued at the end of the interval;
- p50 and p99 enqueue-to-start of the tasks completed in the interval (`started_at - created_at`
  of their rows, within 1 %: counted in logarithmic buckets of 1 %);
- the size of the skiplock schema: `pg_total_relation_size` of every table summed (heap, TOAST
  and indexes), with each table and index apart, and the dead tuples and autovacuum runs of
  `tasks` and `task_events`.
It prints one row per interval, the relations' sizes at the size reference and at the end, and
the verdict.

Pass (exit 0), for a run of 30 minutes: the throughput and the p99 of the 5 minutes after the
warm-up against the last 5 minutes: throughput within 10 % either way, p99 at most 10 % higher
(a p99 that falls is no decay); and sizes flat: the last sample at most 1.2 times the one at
minute 10. A shorter run scales them: each window is a quarter of the run (at most 5 minutes),
the warm-up a fifth at most, the size reference at a third of the run (at most minute 10).
Exit 1 when a criterion is missed, 2 on an error. At the end the enqueuer stops, the backlog
drains, and every task enqueued must have been completed once.

`tests/reliability/test_soak.py` runs a short form of the same `Soak` in `make test`; `make soak`
runs the full 30 minutes. A report, never a test of timings: the figures go to RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg

import skiplock
from skiplock.engine import migrate
from tests.benchmarks.run import BENCH_SERVER_SETTINGS
from tests.pgcluster import ThrowawayCluster
from tests.support import harness

KIND, HANDLERS = "bench.noop", "tests.benchmarks.handlers_skiplock"
RETAIN_COMPLETED_SECONDS = 30
RETENTION_SECONDS = 5
# how often the completed events are read: well within the retention, so none is deleted unread
TICK_SECONDS = 5.0
# an event is counted once its transaction has surely committed: `at` is the transaction's start
COMMIT_LAG_SECONDS = 2.0
ENQUEUE_EVERY = 0.1
# the relations of the per-minute table; every other one is in the total and the breakdown
WATCHED = ("tasks", "task_events")


@dataclasses.dataclass
class Sample:
    """One interval: what was completed in it, and the state of the database at its end."""
    minute: float            # end of the interval, minutes since the enqueuer started
    seconds: float           # its length (database time)
    completed: int
    enqueued: int            # tasks enqueued so far
    backlog: int             # queued at the end
    running: int
    p50: float | None        # seconds, enqueue to start, of the tasks completed in the interval
    p99: float | None
    size: int                # bytes: every table of the schema with its TOAST and indexes
    relations: dict[str, int]
    tables: dict[str, dict[str, int]]  # tasks, task_events: live and dead tuples, autovacuum runs
    deleted: int             # completed tasks deleted by retention so far
    oldest_xact: float       # seconds: the oldest open transaction of a skiplock role at the end
                             # (one that stays open holds back what vacuum may remove)
    machine: dict[str, float] = dataclasses.field(default_factory=dict)  # MachineProbe.take()
    buckets: dict[int, int] = dataclasses.field(repr=False, default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0


def _quantile(buckets: Counter | dict[int, int], q: float) -> float | None:
    """The q-quantile of latencies counted in 1 % logarithmic buckets (bucket b holds values near
    exp(b / 100) ms), in seconds."""
    total = sum(buckets.values())
    if not total:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= rank:
            return math.exp(bucket / 100) / 1000
    return math.exp(max(buckets) / 100) / 1000


# The latencies of the tasks whose completion committed in [since, until), counted in 1 % buckets
# of milliseconds. The outcome events are found through task_events_outcome_at, each task by its
# primary key (OFFSET 0 keeps the probe per event: as a join the planner may hash the whole table).
LATENCIES = """
SELECT round(ln(greatest(extract(epoch FROM t.started_at - t.created_at) * 1000, 0.01)) * 100)::int, count(*)
FROM skiplock.task_events AS e
CROSS JOIN LATERAL (
    SELECT started_at, created_at FROM skiplock.tasks WHERE id = e.task_id OFFSET 0
) AS t
WHERE e.type = 'completed' AND e.at >= %(since)s AND e.at < %(until)s
GROUP BY 1
"""
RELATIONS = """
SELECT c.relname, c.relkind,
       CASE c.relkind WHEN 'r' THEN pg_table_size(c.oid) ELSE pg_relation_size(c.oid) END
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'skiplock' AND c.relkind IN ('r', 'i')
"""
# the roles' connections name themselves skiplock-*; the driver's own (psycopg's default) do not
OLDEST_XACT = """
SELECT greatest(0, coalesce(extract(epoch FROM max(now() - xact_start)), 0))::float8
FROM pg_stat_activity WHERE application_name LIKE 'skiplock%%' AND xact_start IS NOT NULL
"""
TABLES = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE schemaname = 'skiplock' AND relname = ANY(%(names)s)
"""


class MachineProbe(threading.Thread):
    """What the machine did to every process in an interval, to tell its stalls from skiplock's or
    Postgres's. Every 0.1 s it reads each CPU's counters (/proc/stat) and times its own sleep:
    - overslept: the longest time this thread overslept a 0.1 s sleep (it needs no lock and no
      database, so only the machine can hold it up; it sees only the CPU it runs on);
    - steal and iowait: the shares of all CPU time the kernel counted as stolen by the hypervisor
      and as waiting for I/O, over the interval;
    - worst_steal: the largest share of any one second that the hypervisor took from any one CPU,
      which a process on that CPU (the worker, Postgres) lost whole."""

    TICK = 0.1
    WINDOW = 10  # ticks: one second

    def __init__(self):
        super().__init__(name="machine-probe", daemon=True)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._overslept = self._worst = 0.0
        self._ticks: list[list[tuple[int, int]]] = []  # per tick, per CPU: (steal, total) jiffies
        self._previous = self._read_cpus()
        self._interval_start = self._previous

    @staticmethod
    def _read_cpus() -> list[list[int]]:
        """[all CPUs, cpu0, cpu1, ...], each user nice system idle iowait irq softirq steal."""
        try:
            with open("/proc/stat") as stat:
                return [[int(n) for n in line.split()[1:9]] for line in stat if line.startswith("cpu")]
        except OSError:  # not Linux: the shares stay 0
            return []

    def run(self) -> None:
        while not self._halt.is_set():
            before = time.monotonic()
            time.sleep(self.TICK)
            late = time.monotonic() - before - self.TICK
            cpus = self._read_cpus()
            tick = [(now[7] - was[7], sum(now) - sum(was)) for now, was in zip(cpus[1:], self._previous[1:])]
            self._previous = cpus
            self._ticks = (self._ticks + [tick])[-self.WINDOW:]
            second = [(sum(t[i][0] for t in self._ticks), sum(t[i][1] for t in self._ticks))
                      for i in range(len(tick))]
            worst = max((stolen / total for stolen, total in second if total), default=0.0)
            with self._lock:
                self._overslept = max(self._overslept, late)
                if len(self._ticks) == self.WINDOW:
                    self._worst = max(self._worst, worst)

    def take(self) -> dict[str, float]:
        """Since the last take: overslept (seconds), steal and iowait (% of all CPU time),
        worst_steal (% of the worst second of the worst CPU)."""
        with self._lock:
            overslept, worst = self._overslept, self._worst
            self._overslept = self._worst = 0.0
        cpus, start = self._read_cpus(), self._interval_start
        self._interval_start = cpus
        if not cpus or not start:
            return {"overslept": overslept, "steal": 0.0, "iowait": 0.0, "worst_steal": 0.0}
        delta = [a - b for a, b in zip(cpus[0], start[0])]
        total = sum(delta) or 1
        return {"overslept": overslept, "steal": 100 * delta[7] / total, "iowait": 100 * delta[4] / total,
                "worst_steal": 100 * worst}

    def stop(self) -> None:
        self._halt.set()


class Enqueuer(threading.Thread):
    """Enqueues `rate` tasks per second, a batch every ENQUEUE_EVERY seconds, each batch committed
    before the next; a batch that falls behind is made up by the next one."""

    def __init__(self, url: str, rate: float, kind: str = KIND):
        super().__init__(name="enqueuer", daemon=True)
        self.url, self.rate, self.kind = url, rate, kind
        self.sent = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url) as conn:
                start = time.monotonic()
                while not self._halt.is_set():
                    due = int(self.rate * (time.monotonic() - start)) - self.sent
                    if due > 0:
                        skiplock.enqueue_many(conn, self.kind, [{}] * due)
                        conn.commit()
                        self.sent += due
                    self._halt.wait(ENQUEUE_EVERY)
        except BaseException as exc:  # reported by the soak, which stops
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class Soak:
    """One worker and one scheduler on a migrated database, a steady enqueuer, and the recorder.
    `spawn` is harness.ProcessGroup.spawn (the test passes its `processes` fixture's)."""

    def __init__(self, url: str, spawn: Callable[..., harness.Proc], wait_ready: Callable[[harness.Proc], None],
                 *, concurrency: int = 100, handlers: str = HANDLERS, kind: str = KIND,
                 retain_completed: float = RETAIN_COMPLETED_SECONDS, retention_every: float = RETENTION_SECONDS,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
        self.url, self.kind, self.log = url, kind, log
        self.db = psycopg.connect(url, autocommit=True)
        self.worker = spawn(url, tasks=handlers, env={"SKIPLOCK_CONCURRENCY": concurrency})
        self.scheduler = spawn(url, command="scheduler", env={
            "SKIPLOCK_RETAIN_COMPLETED_SECONDS": retain_completed,
            "SKIPLOCK_RETENTION_SECONDS": retention_every})
        for proc in (self.worker, self.scheduler):
            wait_ready(proc)
        self.samples: list[Sample] = []
        self.enqueuer: Enqueuer | None = None
        self.machine = MachineProbe()
        self.completed = 0  # completions counted so far, over every window
        self.deleted_before = 0  # tasks retention deleted before run() (measure_drain's)

    def close(self) -> None:
        if self.enqueuer is not None and self.enqueuer.is_alive():
            self.enqueuer.stop()
        self.machine.stop()
        self.db.close()

    def _scalar(self, sql: str, params: dict | None = None):
        return harness.scalar(self.db, sql, params)

    def measure_drain(self, tasks: int, timeout: float = 600) -> float:
        """The worker's drain rate, tasks/s: `tasks` no-op tasks committed at once, from the first
        start to the last finish (database times). The tasks and their events are removed after."""
        skiplock.enqueue_many(self.url, self.kind, [{}] * tasks)
        harness.wait_for(lambda: self._scalar(
            "SELECT count(*) FROM skiplock.tasks WHERE state IN ('queued', 'running')") == 0,
            timeout, interval=0.5, message=f"a drain of {tasks} tasks")
        seconds = self._scalar("SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 "
                               "FROM skiplock.tasks")
        self.db.execute("TRUNCATE skiplock.tasks, skiplock.task_events")
        self.db.execute("VACUUM ANALYZE skiplock.tasks, skiplock.task_events")
        return tasks / seconds

    def _deleted(self) -> int:
        value = harness.metric(self.scheduler.metrics_port, "skiplock_tasks_deleted_total", state="completed")
        return int(value or 0) - self.deleted_before

    def _read_window(self, since, until, buckets: Counter) -> int:
        rows = self.db.execute(LATENCIES, {"since": since, "until": until}).fetchall()
        n = 0
        for bucket, count in rows:
            buckets[bucket] += count
            n += count
        self.completed += n
        return n

    def _sample(self, minute: float, seconds: float, completed: int, buckets: Counter) -> Sample:
        relations, size = {}, 0
        for name, kind, nbytes in self.db.execute(RELATIONS).fetchall():
            relations[name] = nbytes
            size += nbytes
        tables = {name: {"live": live, "dead": dead, "autovacuum": vacuums, "autoanalyze": analyzes}
                  for name, live, dead, vacuums, analyzes in self.db.execute(TABLES, {"names": list(WATCHED)})}
        states = dict(self.db.execute(
            "SELECT state, count(*) FROM skiplock.tasks WHERE state IN ('queued', 'running') GROUP BY state"))
        return Sample(minute=minute, seconds=seconds, completed=completed,
                      enqueued=self.enqueuer.sent if self.enqueuer else 0,
                      backlog=states.get("queued", 0), running=states.get("running", 0),
                      p50=_quantile(buckets, 0.50), p99=_quantile(buckets, 0.99), size=size,
                      relations=relations, tables=tables, deleted=self._deleted(),
                      oldest_xact=self._scalar(OLDEST_XACT), machine=self.machine.take(), buckets=dict(buckets))

    def run(self, rate: float, seconds: float, interval: float, tick: float = TICK_SECONDS,
            on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
        """Enqueue at `rate` for `seconds`, one Sample per `interval`; then stop enqueuing and
        count the completions until the backlog has drained (`drain()`)."""
        now = "SELECT now() - %(lag)s * interval '1 second'"
        lag = {"lag": COMMIT_LAG_SECONDS}
        self.enqueuer = Enqueuer(self.url, rate, self.kind)
        self.deleted_before = 0
        self.deleted_before = self._deleted()
        start_db = self._scalar("SELECT now()")
        start = time.monotonic()
        self.enqueuer.start()
        if not self.machine.is_alive():
            self.machine.start()
        self.machine.take()
        self._since = since = interval_start = start_db
        buckets, completed = Counter(), 0
        while time.monotonic() - start < seconds:
            time.sleep(min(tick, max(0.0, seconds - (time.monotonic() - start))))
            if self.enqueuer.error is not None:
                raise RuntimeError(f"the enqueuer failed: {self.enqueuer.error!r}") from self.enqueuer.error
            for proc, role in ((self.worker, "worker"), (self.scheduler, "scheduler")):
                if not proc.alive():
                    raise RuntimeError(f"the {role} exited:\n{proc.log()[-3000:]}")
            until = self._scalar(now, lag)
            completed += self._read_window(since, until, buckets)
            since = until
            length = (until - interval_start).total_seconds()
            if length >= interval - tick / 2:
                sample = self._sample((until - start_db).total_seconds() / 60, length, completed, buckets)
                self.samples.append(sample)
                if on_sample:
                    on_sample(sample)
                interval_start, buckets, completed = until, Counter(), 0
        self.enqueuer.stop()
        if self.enqueuer.error is not None:
            raise RuntimeError(f"the enqueuer failed: {self.enqueuer.error!r}") from self.enqueuer.error
        self._since = since
        return self.samples

    def drain(self, timeout: float = 300) -> dict[str, int]:
        """After run(): wait until nothing is queued or running, count the last completions, and
        return the totals: enqueued, completed (counted from their events), deleted (completed
        tasks retention deleted, from the scheduler's counter) and kept (completed tasks still
        stored). Every task enqueued is deleted or kept: completed, never lost."""
        harness.wait_for(lambda: self._scalar(
            "SELECT count(*) FROM skiplock.tasks WHERE state IN ('queued', 'running')") == 0,
            timeout, interval=0.5, message="the backlog to drain")
        # wait out the commit lag, then count every window up to now
        time.sleep(COMMIT_LAG_SECONDS + 0.5)
        self._read_window(self._since, self._scalar("SELECT now()"), Counter())
        # retention goes on deleting, and the scheduler counts a batch just after its commit: a
        # table read between the two sees rows gone that the counter does not have yet. Read the
        # counter on both sides of the table until it did not move in between.
        for _ in range(50):
            deleted = self._deleted()
            kept = self._scalar("SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")
            if self._deleted() == deleted:
                break
        return {"enqueued": self.enqueuer.sent, "completed": self.completed, "deleted": deleted, "kept": kept}


# ---------------------------------------------------------------------------------- verdict


@dataclasses.dataclass
class Verdict:
    first: tuple[float, float]   # minutes: the window after the warm-up
    last: tuple[float, float]
    throughput: tuple[float, float]
    p99: tuple[float | None, float | None]
    size_minute: float
    size: tuple[int, int]        # bytes at the size reference, at the end
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


def _pooled(samples: list[Sample]) -> tuple[float, float | None]:
    buckets: Counter = Counter()
    for s in samples:
        buckets.update(s.buckets)
    seconds = sum(s.seconds for s in samples)
    return sum(s.completed for s in samples) / seconds if seconds else 0.0, _quantile(buckets, 0.99)


def judge(samples: list[Sample], warmup_minutes: float) -> Verdict:
    """The pass criteria of the module docstring."""
    end = samples[-1].minute
    window = min(5.0, end / 4)
    warmup_minutes = min(warmup_minutes, end / 5)  # a short run scales its warm-up too
    first = (warmup_minutes, warmup_minutes + window)
    last = (end - window, end)
    eps = 1e-6
    in_first = [s for s in samples if first[0] + eps < s.minute <= first[1] + eps]
    in_last = [s for s in samples if last[0] + eps < s.minute <= last[1] + eps]
    (t_first, p_first), (t_last, p_last) = _pooled(in_first), _pooled(in_last)
    size_minute = min(10.0, end / 3)
    reference = min(samples, key=lambda s: abs(s.minute - size_minute))
    failures = []
    if not in_first or not in_last:
        failures.append("too few samples for the windows")
    if t_first and abs(t_last / t_first - 1) > 0.10:
        failures.append(f"throughput {t_last:,.0f}/s in the last window against {t_first:,.0f}/s after the warm-up")
    if p_first and p_last and p_last > 1.10 * p_first:
        failures.append(f"p99 {p_last * 1000:.1f} ms in the last window against {p_first * 1000:.1f} ms")
    if samples[-1].size > 1.2 * reference.size:
        failures.append(f"size {samples[-1].size / 2**20:.1f} MB at the end against "
                        f"{reference.size / 2**20:.1f} MB at minute {reference.minute:.1f}")
    return Verdict(first, last, (t_first, t_last), (p_first, p_last), reference.minute,
                   (reference.size, samples[-1].size), failures)


# ---------------------------------------------------------------------------------- report


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f}"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f}"


def header() -> str:
    return ("| minute | completed/s | backlog | p50 (ms) | p99 (ms) | size (MB) | tasks + idx (MB) "
            "| events + idx (MB) | dead tasks / events | autovacuums tasks / events | deleted "
            "| oldest xact (s) | machine: longest oversleep (ms), steal / iowait (%), worst 1-s steal of a CPU (%) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def _table_and_indexes(s: Sample, table: str, indexes: dict[str, str]) -> int:
    return s.relations.get(table, 0) + sum(n for name, n in s.relations.items() if indexes.get(name) == table)


def row(s: Sample, indexes: dict[str, str]) -> str:
    t, e = s.tables.get("tasks", {}), s.tables.get("task_events", {})
    return (f"| {s.minute:.1f} | {s.throughput:,.0f} | {s.backlog:,} | {_ms(s.p50)} | {_ms(s.p99)} "
            f"| {_mb(s.size)} | {_mb(_table_and_indexes(s, 'tasks', indexes))} "
            f"| {_mb(_table_and_indexes(s, 'task_events', indexes))} "
            f"| {t.get('dead', 0):,} / {e.get('dead', 0):,} | {t.get('autovacuum', 0)} / {e.get('autovacuum', 0)} "
            f"| {s.deleted:,} | {s.oldest_xact:.1f} "
            f"| {s.machine.get('overslept', 0) * 1000:.0f}, {s.machine.get('steal', 0):.1f} / "
            f"{s.machine.get('iowait', 0):.1f}, {s.machine.get('worst_steal', 0):.0f} |")


def index_owners(conn) -> dict[str, str]:
    """index name -> table name, for the skiplock schema."""
    return dict(conn.execute(
        "SELECT i.relname, t.relname FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid "
        "JOIN pg_class AS t ON t.oid = x.indrelid JOIN pg_namespace AS n ON n.oid = t.relnamespace "
        "WHERE n.nspname = 'skiplock'").fetchall())


def breakdown(a: Sample, b: Sample) -> str:
    """Every relation's size at two samples, largest first (relations under 64 kB left out)."""
    lines = [f"| relation | minute {a.minute:.1f} (MB) | minute {b.minute:.1f} (MB) |", "|---|---:|---:|"]
    for name in sorted(b.relations, key=lambda n: -b.relations[n]):
        if max(a.relations.get(name, 0), b.relations[name]) >= 64 * 1024:
            lines.append(f"| {name} | {_mb(a.relations.get(name, 0))} | {_mb(b.relations[name])} |")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--interval", type=float, default=60, help="seconds per sample (default 60)")
    parser.add_argument("--rate", type=float, help="tasks/s to enqueue (default: a fraction of the drain rate)")
    parser.add_argument("--rate-fraction", type=float, default=0.6)
    parser.add_argument("--drain-tasks", type=int, default=30_000)
    parser.add_argument("--warmup-minutes", type=float, default=2)
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's SKIPLOCK_CONCURRENCY")
    parser.add_argument("--json", help="also write every sample as JSON to this path")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a Postgres setting over the defaults (experiments; printed in the header)")
    parser.add_argument("--server-log", help="copy the server's log here at the end")
    parser.add_argument("--sql", action="append", default=[],
                        help="a statement run after migrating (experiments: storage parameters, ...)")
    args = parser.parse_args(argv)
    settings = {**BENCH_SERVER_SETTINGS, **dict(item.split("=", 1) for item in args.setting)}

    def interrupted(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)

    processes = harness.ProcessGroup()
    cluster = ThrowawayCluster(settings=settings)
    soak = None
    try:
        cluster.start()
        migrate.apply(cluster.url)
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            for statement in args.sql:
                conn.execute(statement)
        soak = Soak(cluster.url, processes.spawn, processes.wait_ready, concurrency=args.concurrency)
        version = harness.scalar(soak.db, "SHOW server_version")
        drain = None
        if args.rate is None:
            drain = soak.measure_drain(args.drain_tasks)
            rate = args.rate_fraction * drain
            soak.log(f"drain of {args.drain_tasks:,} tasks by one worker: {drain:,.0f} tasks/s; "
                     f"enqueueing {rate:,.0f}/s")
        else:
            rate = args.rate
        owners = index_owners(soak.db)
        print(f"soak: PostgreSQL {version}, {', '.join(f'{k}={v}' for k, v in settings.items())}; "
              f"one worker (concurrency {args.concurrency}), one scheduler; completed tasks kept "
              f"{RETAIN_COMPLETED_SECONDS} s, retention every {RETENTION_SECONDS} s; "
              + (f"drain rate {drain:,.0f}/s, " if drain else "")
              + f"enqueue {rate:,.0f}/s for {args.minutes:g} min"
              + "".join(f"; {statement}" for statement in args.sql) + "\n", flush=True)
        print(header(), flush=True)
        samples = soak.run(rate, args.minutes * 60, args.interval,
                           on_sample=lambda s: print(row(s, owners), flush=True))
        totals = soak.drain()
        verdict = judge(samples, args.warmup_minutes)
        reference = min(samples, key=lambda s: abs(s.minute - verdict.size_minute))
        print()
        print(breakdown(reference, samples[-1]))
        print()
        print(f"totals: {totals['enqueued']:,} enqueued, {totals['completed']:,} completed, "
              f"{totals['deleted']:,} deleted by retention, {totals['kept']:,} kept")
        p_first, p_last = verdict.p99
        print(f"minutes {verdict.first[0]:.1f}–{verdict.first[1]:.1f} against "
              f"{verdict.last[0]:.1f}–{verdict.last[1]:.1f}: "
              f"throughput {verdict.throughput[0]:,.0f} → {verdict.throughput[1]:,.0f}/s, "
              f"p99 {_ms(p_first)} → {_ms(p_last)} ms; size {_mb(verdict.size[0])} MB at minute "
              f"{verdict.size_minute:.1f} → {_mb(verdict.size[1])} MB at the end")
        if totals["deleted"] + totals["kept"] != totals["enqueued"] or totals["completed"] != totals["enqueued"]:
            verdict.failures.append(f"{totals['enqueued']:,} tasks enqueued, {totals['completed']:,} counted as "
                                    f"completed, {totals['deleted'] + totals['kept']:,} deleted or kept")
        print("PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.failures))
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"rate": rate, "drain": drain, "totals": totals, "failures": verdict.failures,
                           "samples": [dataclasses.asdict(s) for s in samples]}, out, default=str)
        return 0 if verdict.passed else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"soak failed: {exc}", file=sys.stderr)
        if soak is not None:
            for proc in (soak.worker, soak.scheduler):
                print(proc.log()[-2000:], file=sys.stderr)
        return 2
    finally:
        if soak is not None:
            soak.close()
        processes.kill_all()
        if args.server_log and cluster.base_dir is not None:
            shutil.copyfile(cluster.log_path, args.server_log)
        cluster.cleanup()


if __name__ == "__main__":
    sys.exit(_main())

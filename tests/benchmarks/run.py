"""Benchmark skiplock against PgQueuer, Procrastinate and a raw SKIP LOCKED loop, side by side.

    python -m tests.benchmarks.run [--tasks 20000] [--systems skiplock,pgqueuer,procrastinate,raw]
                                   [--quick] [--json out.json] [--api-only | --no-api]

Every system runs on the same Postgres server (``$SKIPLOCK_TEST_DATABASE_URL``, default
``postgresql://postgres@127.0.0.1:5432/postgres``), each in its own database created for the run
(``bench_<system>_<pid>``, schema installed by the system's own installer) and every phase in a
fresh copy of it (``CREATE DATABASE ... TEMPLATE``), dropped afterwards. Workers are real
subprocesses; the enqueue side is a subprocess too, so every phase can be bounded by a timeout.
A phase that fails or times out shows ``error`` / ``timeout`` in its cell and the run goes on.
The API phase (skiplock only) starts ``skiplock api`` under gunicorn and drives it over HTTP.

This is a report: nothing here asserts a timing. See README.md for what each number means.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.benchmarks import latency as latency_mod
from tests.benchmarks import systems as systems_mod

REPO_ROOT = Path(__file__).resolve().parents[2]
# A server of the run's own unless one is named: Postgres's defaults, autovacuum on, fsync on, as a
# production server runs (the suite's shared server runs with autovacuum off). Only max_connections
# is raised, for the peers' worker pools side by side.
BENCH_SERVER_SETTINGS = {"fsync": True, "synchronous_commit": True, "full_page_writes": True,
                         "autovacuum": True, "max_connections": 200}
ALL_SYSTEMS = ["skiplock", "pgqueuer", "procrastinate", "raw"]
POLL_INTERVAL = 0.1

METRICS: list[tuple[str, str, str]] = [
    # key, label, kind ("rate": higher is better; "ms" and "us": lower is better)
    ("enqueue_single", "enqueue, single (tasks/s)", "rate"),
    ("enqueue_bulk", "enqueue, bulk (tasks/s)", "rate"),
    ("drain_1", "drain, 1 worker (tasks/s)", "rate"),
    ("drain_2", "drain, 2 workers (tasks/s)", "rate"),
    ("drain_1_steady", "drain, 1 worker, excl. startup (tasks/s)", "rate"),
    ("drain_2_steady", "drain, 2 workers, excl. startup (tasks/s)", "rate"),
    ("drain_1_db_cpu", "drain, 1 worker: Postgres CPU per task (µs)", "us"),
    ("drain_1_worker_cpu", "drain, 1 worker: worker process CPU per task (µs)", "us"),
    ("lat_p50", "enqueue→start p50 (ms)", "ms"),
    ("lat_p95", "enqueue→start p95 (ms)", "ms"),
    ("lat_p99", "enqueue→start p99 (ms)", "ms"),
    ("api_single", "API submit, single (tasks/s)", "rate"),
    ("api_batch", "API submit, batch (tasks/s)", "rate"),
]


class PhaseFailed(Exception):
    """A phase did not produce a number; ``cell`` is what the table shows instead."""

    def __init__(self, cell: str, message: str) -> None:
        super().__init__(message)
        self.cell = cell


# ------------------------------------------------------------------------------- helpers


def url_with_db(url: str, dbname: str) -> str:
    """The same server URL pointing at ``dbname`` (URL form: asyncpg takes only URLs)."""
    if "://" not in url:  # a key=value conninfo: rebuild it as a URL
        params = conninfo_to_dict(url)
        user = params.pop("user", "")
        password = params.pop("password", "")
        host = params.pop("host", "127.0.0.1")
        port = params.pop("port", "5432")
        params.pop("dbname", None)
        auth = urllib.parse.quote(str(user), safe="")
        if password:
            auth += ":" + urllib.parse.quote(str(password), safe="")
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        return f"postgresql://{auth}@{host}:{port}/{dbname}" + (f"?{query}" if query else "")
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an already sorted list."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


@dataclass
class Options:
    tasks: int
    latency_tasks: int
    latency_rate: float
    bulk_chunk: int
    timeout_scale: float
    repeat: int
    settings: systems_mod.WorkerSettings
    keep_logs: bool
    # the API phase: which phases run at all, and its load
    api: bool = True
    api_only: bool = False
    api_workers: int = 2
    api_clients: int = 8
    api_requests: int = 500  # per client
    api_batches: int = 10
    api_batch_size: int = 1000
    api_batch_clients: int = 2


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class SystemResult:
    name: str
    cells: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    config: str = ""


# -------------------------------------------------------------------------------- runner


class Runner:
    """The generic harness around one adapter: setup / enqueue_single / enqueue_bulk /
    start_workers / stop_workers / count_done / drain / latency."""

    def __init__(self, system: systems_mod.System, server_url: str, run_dir: Path, opts: Options):
        self.system = system
        self.server_url = server_url
        self.run_dir = run_dir
        self.opts = opts
        self.template = f"bench_{system.name}_{os.getpid()}"
        self.databases: list[str] = []
        self.workers: list[Worker] = []
        self.result = SystemResult(system.name)
        self.samples: dict[str, list[Any]] = {}  # phase -> one value per repetition
        self.failures: dict[str, str] = {}  # phase -> "error" | "timeout"

    # ---- databases

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.server_url, autocommit=True, connect_timeout=10)

    def create_db(self, name: str, template: str | None = None) -> str:
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        deadline = time.monotonic() + 30
        with self._admin() as conn:
            while True:
                try:
                    conn.execute(stmt)
                    break
                except psycopg.errors.ObjectInUse:
                    # The template still has a closing session (a pool winding down); retry.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        self.databases.append(name)
        return url_with_db(self.server_url, name)

    def drop_db(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if name in self.databases:
            self.databases.remove(name)

    def fresh_db(self, phase: str) -> tuple[str, str]:
        name = f"{self.template}_{phase}"
        return name, self.create_db(name, template=self.template)

    def cleanup(self) -> None:
        self.stop_workers()
        for name in list(reversed(self.databases)):
            try:
                self.drop_db(name)
            except Exception as exc:  # noqa: BLE001 - report and keep cleaning
                print(f"warning: could not drop database {name}: {exc}", file=sys.stderr)

    # ---- subprocesses

    def _env(self, db_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        # The systems' own knobs come only from here: nothing leaks in from the caller's shell
        # (a stray SKIPLOCK_DB_SCHEMA or PROCRASTINATE_APP would change what is measured).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SKIPLOCK_", "PGQUEUER_", "PROCRASTINATE_", "BENCH_"))
        }
        env["BENCH_DB_URL"] = db_url
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def produce(self, db_url: str, op: str, timeout: float, **kw: Any) -> dict[str, Any]:
        argv = [sys.executable, "-m", "tests.benchmarks.producer", self.system.name, op]
        for key, value in kw.items():
            argv += [f"--{key}", str(value)]
        return self._run_json(argv, self._env(db_url), timeout, f"producer {op}",
                              self.run_dir / f"{self.system.name}-producer-{op}.log")

    def _run_json(self, argv: list[str], env: dict[str, str], timeout: float, what: str,
                  log: Path) -> dict[str, Any]:
        """Run a timed helper subprocess whose last stdout line is {"ok": ..., ...}."""
        limit = timeout * self.opts.timeout_scale
        try:
            proc = subprocess.run(
                argv,
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                timeout=limit,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            log.write_bytes((exc.stdout or b"") + (exc.stderr or b""))
            raise PhaseFailed("timeout", f"{what} exceeded {limit:.1f}s") from None
        log.write_bytes(proc.stdout + b"\n--- stderr ---\n" + proc.stderr)
        lines = proc.stdout.decode(errors="replace").strip().splitlines()
        try:
            out = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            out = {}
        if proc.returncode != 0 or not out.get("ok"):
            reason = out.get("error") or tail(log, 5) or f"exit {proc.returncode}"
            raise PhaseFailed("error", f"{what}: {reason}")
        return out

    def start_workers(self, db_url: str, k: int, phase: str, latency_dir: Path | None) -> float:
        """Spawn ``k`` worker processes; returns the wall-clock time just before the first."""
        t0 = time.time()
        for i in range(k):
            argv, extra = self.system.worker_command(db_url, i)
            if latency_dir is not None:
                extra = {**extra, "BENCH_LATENCY_DIR": str(latency_dir)}
            log = self.run_dir / f"{self.system.name}-{phase}-w{i}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    argv,
                    cwd=REPO_ROOT,
                    env=self._env(db_url, extra),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: we stop exactly what we started
                )
            self.workers.append(Worker(proc, log))
        return t0

    def stop_workers(self) -> list[int | None]:
        """SIGTERM each worker's process group, wait, SIGKILL what is left; returns exit codes."""
        workers, self.workers = self.workers, []
        for w in workers:
            if w.proc.poll() is None:
                try:
                    os.killpg(w.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        codes: list[int | None] = []
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                w.proc.wait(timeout=10)
                self.result.notes.append(f"a worker ignored SIGTERM for 15 s and was killed ({w.log.name})")
            codes.append(w.proc.returncode)
        return codes

    def _check_stop_codes(self, codes: list[int | None], phase: str) -> None:
        bad = [c for c in codes if c not in (0, None)]
        if bad:
            self.result.notes.append(
                f"{phase}: worker exit codes after SIGTERM {codes} (expected 0; -15 means SIGTERM "
                "killed it outright, e.g. while it was still starting up)"
            )

    # ---- progress

    def count_done(self, conn: psycopg.Connection[Any]) -> tuple[int, int]:
        done = conn.execute(self.system.count_done_sql).fetchone()[0]  # type: ignore[index]
        failed = 0
        if self.system.count_failed_sql:
            failed = conn.execute(self.system.count_failed_sql).fetchone()[0]  # type: ignore[index]
        return int(done), int(failed)

    def wait_done(
        self, conn: psycopg.Connection[Any], target: int, timeout: float, what: str
    ) -> tuple[float, float | None]:
        """Poll until ``target`` tasks are done. Returns (poll time it was seen, first-done time)."""
        limit = timeout * self.opts.timeout_scale
        deadline = time.monotonic() + limit
        first_done: float | None = None
        while True:
            done, failed = self.count_done(conn)
            now = time.time()
            if done and first_done is None:
                first_done = now
            if done >= target:
                return now, first_done
            if failed:
                raise PhaseFailed("error", f"{what}: {failed} task(s) failed ({done}/{target} done)")
            for w in self.workers:
                if w.proc.poll() is not None:
                    raise PhaseFailed(
                        "error",
                        f"{what}: a worker exited with {w.proc.returncode} at {done}/{target}:\n"
                        + tail(w.log),
                    )
            if time.monotonic() > deadline:
                raise PhaseFailed("timeout", f"{what}: {done}/{target} done after {limit:.1f}s")
            time.sleep(POLL_INTERVAL)

    def cpu_seconds(self, conn: psycopg.Connection[Any]) -> dict[str, float | None]:
        """CPU seconds used so far by the workers' processes (children included) and by the
        Postgres backends connected to this phase's database (other than ours): where the time of
        a drain goes. Read from /proc, so only for a server on this machine; None where unreadable.
        Both include start-up (imports, connecting); a backend that already disconnected is missed."""
        workers = [proc_cpu_seconds(w.proc.pid) for w in self.workers]
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        backends = [proc_cpu_seconds(pid) for pid in pids]
        local = self.server_is_local()
        return {
            "worker": None if None in workers else sum(workers),  # type: ignore[arg-type]
            "db": sum(backends) if local and backends and None not in backends else None,  # type: ignore[arg-type]
        }

    def server_is_local(self) -> bool:
        host = urllib.parse.urlsplit(self.server_url).hostname or "localhost"
        return host in ("localhost", "127.0.0.1", "::1") or host.startswith("/")

    def done_times(self, conn: psycopg.Connection[Any]) -> list[float]:
        """Every completion's epoch seconds as the system recorded it, sorted (may be empty)."""
        if not self.system.done_times_sql:
            return []
        return sorted(float(r[0]) for r in conn.execute(self.system.done_times_sql) if r[0] is not None)

    # ---- phases

    def setup(self) -> None:
        self.system.check_importable()
        self.result.config = self.system.describe()
        url = self.create_db(self.template)
        self.produce(url, "setup", timeout=120)

    def enqueue_single(self, n: int) -> float:
        name, url = self.fresh_db("single")
        try:
            out = self.produce(url, "single", timeout=60 + n / 50, n=n)
            self._verify_rows(url, n, "enqueue single")
        finally:
            self.drop_db(name)
        return n / out["seconds"]

    def enqueue_bulk(self, n: int) -> float:
        name, url = self.fresh_db("bulk")
        try:
            out = self.produce(url, "bulk", timeout=60 + n / 500, n=n, chunk=self.opts.bulk_chunk)
            self._verify_rows(url, n, "enqueue bulk")
        finally:
            self.drop_db(name)
        return n / out["seconds"]

    def _verify_rows(self, url: str, n: int, what: str) -> None:
        """The enqueue really landed: the system's own queue holds ``n`` tasks now."""
        with psycopg.connect(url, autocommit=True) as conn:
            got = conn.execute(self.system.count_all_sql).fetchone()[0]  # type: ignore[index]
        if got != n:
            raise PhaseFailed("error", f"{what}: expected {n} tasks, found {got}")

    def drain(self, k: int, n: int) -> dict[str, Any]:
        """Load ``n`` tasks, spawn ``k`` workers, wait until the DB counts ``n`` done.

        ``rate``: n / (last completion - spawning the first worker), the brief's definition.
        ``steady``: completions after the first one / (last - first completion): the same drain
        without process start-up (imports, connecting, LISTEN), which dominates small runs.
        """
        phase = f"drain{k}"
        name, url = self.fresh_db(phase)
        try:
            self.produce(url, "bulk", timeout=60 + n / 500, n=n, chunk=self.opts.bulk_chunk)
            with psycopg.connect(url, autocommit=True) as conn:
                # Current planner statistics, as autovacuum would keep them on a live server (and
                # may not here: the header prints the server's autovacuum setting). Without them a
                # freshly loaded queue table is planned as nearly empty, and a claim query can pick
                # a plan that reads every queued row per claim.
                conn.execute("ANALYZE")
                done, _ = self.count_done(conn)
                if done:
                    raise PhaseFailed("error", f"{phase}: {done} tasks done before workers started")
                t_start = self.start_workers(url, k, phase, latency_dir=None)
                try:
                    seen_at, first_seen = self.wait_done(conn, n, 60 + n / 50, phase)
                    # read before the workers stop: their processes and Postgres backends end with them
                    cpu = self.cpu_seconds(conn)
                finally:
                    codes = self.stop_workers()
                self._check_stop_codes(codes, phase)
                times = self.done_times(conn)
                final_done, _ = self.count_done(conn)
            if final_done != n:
                self.result.notes.append(f"{phase}: {final_done} tasks done at stop, {n} enqueued")
            # The system's own completion timestamps are exact; the poll ticks are the fallback.
            steady: float | None = None
            if len(times) >= n and t_start <= times[0] and times[-1] <= seen_at + 1:
                first, last = times[0], times[-1]
                # Completions that share the first timestamp (one flushed batch) are not counted.
                after_first = sum(1 for t in times if t > first)
                if last > first:
                    steady = after_first / (last - first)
            else:
                first, last = first_seen or seen_at, seen_at
                self.result.notes.append(f"{phase}: completion times not readable, used poll ticks")
            return {
                "rate": n / (last - t_start),
                "steady": steady,
                "startup": first - t_start,
                "total": last - t_start,
                **{f"{side}_cpu_us": (None if seconds is None else seconds / n * 1e6)
                   for side, seconds in cpu.items()},
            }
        finally:
            self.drop_db(name)

    def latency(self, n: int, rate: float) -> dict[str, Any]:
        """One idle worker; ``n`` single enqueues paced at ``rate``/s; every handler start's
        ``time.time() - t0`` collected from the handlers' files (seconds)."""
        name, url = self.fresh_db("latency")
        lat_dir = Path(tempfile.mkdtemp(prefix=f"{self.system.name}-latency-", dir=self.run_dir))
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                self.start_workers(url, 1, "latency", latency_dir=lat_dir)
                try:
                    # Warm-up probe (no t0, so not recorded): proves the worker is up and listening.
                    self.produce(url, "single", timeout=60, n=1)
                    self.wait_done(conn, 1, 90, "latency warm-up")
                    time.sleep(1.0)  # let the worker go idle, waiting on LISTEN
                    out = self.produce(url, "latency", timeout=60 + 1.5 * n / rate, n=n, rate=rate)
                    self.wait_done(conn, 1 + n, 60, "latency")
                finally:
                    codes = self.stop_workers()
                self._check_stop_codes(codes, "latency")
            values = latency_mod.read_all(str(lat_dir))
            if len(values) != n:
                raise PhaseFailed("error", f"latency: {len(values)} samples recorded, expected {n}")
            return {"samples": values, "achieved_rate": out.get("achieved_rate") or 0.0}
        finally:
            self.drop_db(name)


    def api_submit(self) -> dict[str, Any]:
        """`skiplock api` under gunicorn (``api_workers`` processes) on a fresh database, driven
        over HTTP by a client subprocess: single submits from ``api_clients`` keep-alive clients,
        then batch submits. Every request also writes its audit row, as in production."""
        o = self.opts
        command = self.system.api_command("", "", 0)
        if command is None:
            raise PhaseFailed("–", f"{self.system.name} has no HTTP API")
        name, url = self.fresh_db("api")
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            base = f"http://127.0.0.1:{port}"
            token = secrets.token_hex(32)
            digest = hashlib.sha256(token.encode()).hexdigest()
            argv, extra = self.system.api_command(url, f"127.0.0.1:{port}", o.api_workers)  # type: ignore[misc]
            extra = {**extra, "SKIPLOCK_API_TOKENS": f"bench:submitter:{digest}"}
            log = self.run_dir / f"{self.system.name}-api.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=self._env(url, extra), stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.workers.append(Worker(proc, log))
            self._wait_api_ready(proc, base, log, 60)
            env = {**self._env(url), "BENCH_API_TOKEN": token}
            single_n = o.api_clients * o.api_requests
            single = self._run_json(
                [sys.executable, "-m", "tests.benchmarks.api_client", "single", "--base", base,
                 "--clients", str(o.api_clients), "--requests", str(o.api_requests)],
                env, 60 + single_n / 50, "api single", self.run_dir / f"{self.system.name}-api-single.log")
            batch_n = o.api_batches * o.api_batch_size
            batch = self._run_json(
                [sys.executable, "-m", "tests.benchmarks.api_client", "batch", "--base", base,
                 "--clients", str(o.api_batch_clients), "--batches", str(o.api_batches),
                 "--size", str(o.api_batch_size)],
                env, 60 + batch_n / 500, "api batch", self.run_dir / f"{self.system.name}-api-batch.log")
            codes = self.stop_workers()
            self._check_stop_codes(codes, "api")
            self._verify_rows(url, single_n + batch_n, "api submit")
            return {"single": single_n / single["seconds"], "batch": batch_n / batch["seconds"],
                    "single_p50_ms": single["p50_ms"], "single_p99_ms": single["p99_ms"],
                    "batch_p50_ms": batch["p50_ms"], "batch_p99_ms": batch["p99_ms"]}
        finally:
            self.stop_workers()
            self.drop_db(name)

    def _wait_api_ready(self, proc: subprocess.Popen[bytes], base: str, log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout * self.opts.timeout_scale
        while True:
            if proc.poll() is not None:
                raise PhaseFailed("error", f"skiplock api exited with {proc.returncode}:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise PhaseFailed("timeout", f"skiplock api not ready after {timeout:.0f}s:\n{tail(log)}")
            time.sleep(POLL_INTERVAL)


# --------------------------------------------------------------------------------- driver

# phase name -> (table keys it fills, how to run it once)
PHASES: list[tuple[str, list[str], Any]] = [
    ("enqueue single", ["enqueue_single"], lambda r, o: r.enqueue_single(o.tasks)),
    ("enqueue bulk", ["enqueue_bulk"], lambda r, o: r.enqueue_bulk(o.tasks)),
    ("drain 1 worker", ["drain_1", "drain_1_steady", "drain_1_db_cpu", "drain_1_worker_cpu"],
     lambda r, o: r.drain(1, o.tasks)),
    ("drain 2 workers", ["drain_2", "drain_2_steady"], lambda r, o: r.drain(2, o.tasks)),
    ("latency", ["lat_p50", "lat_p95", "lat_p99"],
     lambda r, o: r.latency(o.latency_tasks, o.latency_rate)),
    ("api submit", ["api_single", "api_batch"], lambda r, o: r.api_submit()),
]
API_PHASE = "api submit"


def selected(phase: str, opts: Options) -> bool:
    """Whether the run measures this phase at all (--api-only / --no-api)."""
    return opts.api if phase == API_PHASE else not opts.api_only


def applies(runner: Runner, phase: str, opts: Options) -> bool:
    """Whether this phase runs for this system: the API phase only for a system with an HTTP API."""
    if not selected(phase, opts):
        return False
    return phase != API_PHASE or runner.system.api_command("", "", 0) is not None


def run_phase(runner: Runner, phase: str, fn: Any, opts: Options, rep: int) -> None:
    """Run one repetition of one phase for one system; a failure is recorded, never raised."""
    name = runner.system.name
    t = time.monotonic()
    print(f"[{name}] {phase} (run {rep + 1}/{opts.repeat}) ...", file=sys.stderr, flush=True)
    try:
        value = fn(runner, opts)
        runner.samples.setdefault(phase, []).append(value)
        shown = value if not isinstance(value, dict) else {
            k: v for k, v in value.items() if k != "samples"
        }
        outcome = f"{shown}"
    except PhaseFailed as exc:
        runner.failures[phase] = exc.cell
        runner.result.notes.append(f"{phase}: {exc.cell}: {exc}")
        outcome = exc.cell
    except Exception as exc:  # noqa: BLE001 - one phase's failure must not stop the run
        runner.failures[phase] = "error"
        runner.result.notes.append(f"{phase}: error: {type(exc).__name__}: {exc}")
        outcome = "error"
    finally:
        runner.stop_workers()
    print(f"[{name}] {phase}: {outcome} ({time.monotonic() - t:.1f}s)", file=sys.stderr, flush=True)


def _spread(values: list[float], unit: str, digits: int = 0) -> str:
    return " / ".join(f"{v:,.{digits}f}" for v in values) + f" {unit}"


def aggregate(runner: Runner, opts: Options) -> None:
    """Fill the table cells: the median over repetitions (latency: percentiles of all samples)."""
    res, cells = runner.result, runner.result.cells
    for phase, keys, _ in PHASES:
        if phase in runner.failures:
            for key in keys:
                cells[key] = runner.failures[phase]
            continue
        runs = runner.samples.get(phase) or []
        if not runs:
            for key in keys:
                cells[key] = "–"
            continue
        if phase.startswith("enqueue"):
            cells[keys[0]] = statistics.median(runs)
            if len(runs) > 1:
                res.notes.append(f"{phase}: runs {_spread(runs, 'tasks/s')} (median shown)")
        elif phase == API_PHASE:
            cells[keys[0]] = statistics.median(r["single"] for r in runs)
            cells[keys[1]] = statistics.median(r["batch"] for r in runs)
            last = runs[-1]
            res.notes.append(
                f"api submit: gunicorn {opts.api_workers} workers × 4 threads; single: {opts.api_clients} "
                f"clients × {opts.api_requests} POST /v1/tasks, request p50/p99 {last['single_p50_ms']:.1f}/"
                f"{last['single_p99_ms']:.1f} ms; batch: {opts.api_batches} × {opts.api_batch_size} tasks "
                f"from {opts.api_batch_clients} clients, request p50/p99 {last['batch_p50_ms']:.0f}/"
                f"{last['batch_p99_ms']:.0f} ms"
                + (f"; single {_spread([r['single'] for r in runs], 'tasks/s')}, batch "
                   f"{_spread([r['batch'] for r in runs], 'tasks/s')} (medians shown)" if len(runs) > 1 else "")
            )
        elif phase.startswith("drain"):
            cells[keys[0]] = statistics.median(r["rate"] for r in runs)
            steady = [r["steady"] for r in runs if r["steady"] is not None]
            cells[keys[1]] = statistics.median(steady) if steady else "–"
            for key, side in zip(keys[2:], ("db", "worker")):
                used = [r[f"{side}_cpu_us"] for r in runs if r.get(f"{side}_cpu_us") is not None]
                cells[key] = statistics.median(used) if used else "–"
            res.notes.append(
                f"{phase}: spawn→last completion {_spread([r['total'] for r in runs], 's', 2)}, "
                f"spawn→first completion {_spread([r['startup'] for r in runs], 's', 2)}"
                + (f"; rates {_spread([r['rate'] for r in runs], 'tasks/s')}" if len(runs) > 1 else "")
            )
        else:
            pooled = sorted(v for r in runs for v in r["samples"])
            for key, q in zip(keys, (50, 95, 99)):
                cells[key] = percentile(pooled, q) * 1000.0
            res.notes.append(
                f"latency: {len(pooled)} samples from {len(runs)} run(s), sent at "
                f"{_spread([r['achieved_rate'] for r in runs], '/s', 1)} (target {opts.latency_rate:g}/s); "
                f"min {pooled[0] * 1000:.1f} ms, max {pooled[-1] * 1000:.1f} ms"
            )


def compile_bytecode() -> list[str]:
    """Compile skiplock's and this package's modules to bytecode before anything is timed.

    PgQueuer and Procrastinate come from wheels, which pip compiles at install; skiplock's Docker
    image is built the same way. A development checkout is an editable install: where
    PYTHONDONTWRITEBYTECODE is set, every worker process would compile skiplock's sources again
    (about 0.1 s of its start-up) and the peers' never. Returns the directories compiled."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("skiplock")
    dirs = list(spec.submodule_search_locations or []) if spec else []
    dirs.append(str(Path(__file__).resolve().parent))
    for d in dirs:
        compileall.compile_dir(d, quiet=1)
    return dirs


def run_all(order: list[str], server_url: str, run_dir: Path, opts: Options) -> dict[str, SystemResult]:
    """Set every system up, then run each phase for each system in turn, ``opts.repeat`` times:
    interleaving spreads any background noise on the machine over all systems alike."""
    runners: dict[str, Runner] = {}
    results: dict[str, SystemResult] = {}
    try:
        for name in order:
            runner = Runner(systems_mod.make(name, opts.settings), server_url, run_dir, opts)
            results[name] = runner.result
            print(f"[{name}] setup ...", file=sys.stderr, flush=True)
            try:
                runner.setup()
                runners[name] = runner
            except Exception as exc:  # noqa: BLE001 - the system's column becomes error/timeout
                cell = exc.cell if isinstance(exc, PhaseFailed) else "error"
                for key, _, _ in METRICS:
                    runner.result.cells[key] = cell
                runner.result.notes.append(f"setup: {cell}: {type(exc).__name__}: {exc}")
                print(f"[{name}] setup failed: {exc}", file=sys.stderr, flush=True)
                runner.cleanup()
        for rep in range(opts.repeat):
            for phase, _keys, fn in PHASES:
                for runner in runners.values():
                    # a failed phase is not retried
                    if phase not in runner.failures and applies(runner, phase, opts):
                        run_phase(runner, phase, fn, opts, rep)
    except KeyboardInterrupt:
        print("interrupted: cleaning up; phases not run show –", file=sys.stderr, flush=True)
        for runner in runners.values():
            runner.result.notes.append("run interrupted before every phase ran")
    finally:
        for runner in runners.values():
            runner.cleanup()
            aggregate(runner, opts)
    return results


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process and its waited-for children, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command: state is field 3; utime, stime, cutime, cstime are fields 14-17
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def fmt(value: Any, kind: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "–"
    if kind == "rate" or kind == "us":
        return f"{value:,.0f}"
    return f"{value:.1f}"


def ratio(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{a / b:.2f}×"
    return "–"


def render_table(results: dict[str, SystemResult], order: list[str], opts: Options | None = None) -> str:
    header = ["metric", *order]
    with_pgq = "skiplock" in results and "pgqueuer" in results
    with_raw = "skiplock" in results and "raw" in results
    if with_pgq:
        header.append("skiplock/pgqueuer")
    if with_raw:
        header.append("skiplock/raw")
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    shown = {key for phase, keys, _ in PHASES if opts is None or selected(phase, opts) for key in keys}
    for key, label, kind in METRICS:
        if key not in shown:
            continue
        row = [label] + [fmt(results[s].cells.get(key), kind) for s in order]
        sk = results.get("skiplock")
        if with_pgq:
            row.append(ratio(sk.cells.get(key), results["pgqueuer"].cells.get(key)))  # type: ignore[union-attr]
        if with_raw:
            row.append(ratio(sk.cells.get(key), results["raw"].cells.get(key)))  # type: ignore[union-attr]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def server_facts(server_url: str) -> str:
    try:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            facts = ", ".join(
                f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
                for name in ("synchronous_commit", "fsync", "shared_buffers", "autovacuum")
            )
        return f"PostgreSQL {version} ({facts})"
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL (unreachable: {exc})"


def redact(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.run",
        description="skiplock vs PgQueuer vs Procrastinate vs a raw SKIP LOCKED loop, one table.",
    )
    parser.add_argument("--tasks", type=int, default=None,
                        help="tasks per enqueue and drain phase (default 20000; --quick: 2000)")
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                        help=f"comma-separated subset/order of {','.join(ALL_SYSTEMS)}")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2,000 tasks and 150 latency samples")
    parser.add_argument("--latency-tasks", type=int, default=None,
                        help="tasks in the latency phase (default 500; --quick: 150)")
    parser.add_argument("--latency-rate", type=float, default=50.0,
                        help="steady enqueue rate of the latency phase, tasks/s (default 50)")
    parser.add_argument("--bulk-chunk", type=int, default=1000,
                        help="tasks per enqueue_many call in bulk enqueue and drain loads (default 1000)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every phase this many times (fresh database each), show the median "
                             "(latency: percentiles over all samples); default 1")
    parser.add_argument("--timeout-scale", type=float, default=1.0,
                        help="multiply every phase timeout by this (default 1)")
    parser.add_argument("--pgqueuer-batch-size", type=int, default=100)
    parser.add_argument("--procrastinate-concurrency", type=int, default=10)
    parser.add_argument("--skiplock-concurrency", type=int, default=100)
    parser.add_argument("--skiplock-claim-batch", type=int, default=0,
                        help="SKIPLOCK_CLAIM_BATCH for the skiplock worker (0: the engine's default, "
                             "as many as free slots)")
    parser.add_argument("--raw-batch-size", type=int, default=100)
    parser.add_argument("--server", metavar="URL", default=os.environ.get("SKIPLOCK_TEST_DATABASE_URL"),
                        help="measure on this server (default $SKIPLOCK_TEST_DATABASE_URL; unset: a throwaway "
                             "cluster of the run's own with Postgres's default settings)")
    parser.add_argument("--json", metavar="PATH", help="also write all numbers and notes as JSON")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the worker/producer logs directory (printed at the end)")
    api = parser.add_mutually_exclusive_group()
    api.add_argument("--api-only", action="store_true",
                     help="only the API phase (skiplock api under gunicorn; implies --systems skiplock)")
    api.add_argument("--no-api", action="store_true", help="leave the API phase out")
    parser.add_argument("--api-workers", type=int, default=2, help="gunicorn workers of skiplock api (default 2)")
    parser.add_argument("--api-clients", type=int, default=8,
                        help="concurrent HTTP clients of the single-submit run (default 8)")
    parser.add_argument("--api-requests", type=int, default=None,
                        help="POST /v1/tasks per client (default 500; --quick: 100)")
    parser.add_argument("--api-batches", type=int, default=None,
                        help="POST /v1/tasks:batch requests (default 10; --quick: 3)")
    parser.add_argument("--api-batch-size", type=int, default=1000, help="tasks per batch request (default 1000)")
    parser.add_argument("--api-batch-clients", type=int, default=2,
                        help="concurrent HTTP clients of the batch run (default 2)")
    args = parser.parse_args(argv)

    if args.api_only:
        args.systems = "skiplock"
    order = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in order if s not in systems_mod.SYSTEMS]
    if unknown or not order:
        parser.error(f"unknown system(s) {unknown}; choose from {ALL_SYSTEMS}")
    tasks = args.tasks or (2000 if args.quick else 20000)
    opts = Options(
        tasks=tasks,
        latency_tasks=args.latency_tasks or (150 if args.quick else 500),
        latency_rate=args.latency_rate,
        bulk_chunk=args.bulk_chunk,
        timeout_scale=args.timeout_scale,
        repeat=max(1, args.repeat),
        settings=systems_mod.WorkerSettings(
            pgqueuer_batch_size=args.pgqueuer_batch_size,
            procrastinate_concurrency=args.procrastinate_concurrency,
            skiplock_concurrency=args.skiplock_concurrency,
            skiplock_claim_batch=args.skiplock_claim_batch,
            raw_batch_size=args.raw_batch_size,
        ),
        keep_logs=args.keep_logs,
        api=not args.no_api,
        api_only=args.api_only,
        api_workers=args.api_workers,
        api_clients=args.api_clients,
        api_requests=args.api_requests or (100 if args.quick else 500),
        api_batches=args.api_batches or (3 if args.quick else 10),
        api_batch_size=args.api_batch_size,
        api_batch_clients=args.api_batch_clients,
    )
    cluster = None
    if args.server:
        server_url = args.server
    else:
        from tests.pgcluster import ThrowawayCluster

        cluster = ThrowawayCluster(settings=BENCH_SERVER_SETTINGS)
        print("starting a throwaway Postgres with default settings (--server to name one)", file=sys.stderr)
        server_url = cluster.start().url
    try:
        return _measure(args, opts, order, tasks, server_url)
    finally:
        if cluster is not None:
            cluster.cleanup()


def _measure(args: argparse.Namespace, opts: Options, order: list[str], tasks: int, server_url: str) -> int:
    # SIGTERM to the orchestrator unwinds like Ctrl-C, so workers are stopped and databases dropped.
    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    compile_bytecode()
    run_dir = Path(tempfile.mkdtemp(prefix="skiplock-bench-"))
    started = time.monotonic()
    load_before = os.getloadavg()[1]
    results = run_all(order, server_url, run_dir, opts)
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()[1]

    print()
    if opts.api_only:
        title = (f"## skiplock benchmark — API submission: {opts.api_clients} × {opts.api_requests:,} single, "
                 f"{opts.api_batches} × {opts.api_batch_size:,} batch")
    else:
        title = (f"## skiplock benchmark — {tasks:,} tasks per enqueue/drain phase, "
                 f"{opts.latency_tasks} latency tasks at {opts.latency_rate:g}/s")
    print(title + (f", {opts.repeat} runs each (median)" if opts.repeat > 1 else ""))
    print()
    print(
        f"{server_facts(server_url)} at {redact(server_url)}; {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}; bulk calls of {opts.bulk_chunk}; run took {elapsed:.0f}s; "
        f"5-min load average {load_before:.1f} before the run, {load_after:.1f} at its end; "
        "skiplock's modules compiled to bytecode first, as installed wheels are"
    )
    print()
    print(render_table(results, order, opts))
    print()
    print("Throughput rows: higher is better; latency and CPU rows: lower is better (so a ratio < 1 is "
          "better for skiplock there). `error`/`timeout`: see the notes.")
    print()
    print("### Configuration")
    for name in order:
        print(f"- {results[name].config or name + ': (not set up)'}")
    print()
    print("### Notes")
    for name in order:
        for note in results[name].notes:
            print(f"- {name}: " + note.replace("\n", "\n    "))

    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "tasks": tasks,
                    "latency_tasks": opts.latency_tasks,
                    "latency_rate": opts.latency_rate,
                    "bulk_chunk": opts.bulk_chunk,
                    "server": server_facts(server_url),
                    "systems": {
                        n: {"cells": r.cells, "notes": r.notes, "config": r.config}
                        for n, r in results.items()
                    },
                },
                indent=2,
            )
        )
    if args.keep_logs:
        print(f"\nlogs kept in {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

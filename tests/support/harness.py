"""Test helpers: waiting on conditions with a deadline, real skiplock processes, metrics scraping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.pgcluster import free_port  # noqa: F401  (the tests' one way to pick a port)

ROOT = Path(__file__).resolve().parents[2]
ENV_PREFIX = "SKIPLOCK_"


def scrub_environment(environ, keep=()) -> None:
    """Remove every SKIPLOCK_* variable but those in `keep` from `environ` (os.environ, or a dict
    for a child)."""
    for name in [k for k in environ if k.startswith(ENV_PREFIX) and k not in keep]:
        del environ[name]


def child_environment(**extra) -> dict[str, str]:
    """os.environ without any SKIPLOCK_* variable, plus `extra`: what a spawned process starts from
    (a test names every SKIPLOCK_* setting its process gets)."""
    env = dict(os.environ)
    scrub_environment(env)
    env.update({k: str(v) for k, v in extra.items()})
    return env

SUPPORT_SCHEMA = """
CREATE TABLE public.executions (
    task_id uuid NOT NULL,
    pid integer NOT NULL,
    attempt integer,
    note text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE public.ledger (
    task_id uuid NOT NULL,
    amount integer NOT NULL
);
CREATE TABLE public.step_rows (
    task_id uuid NOT NULL,
    step integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def wait_for(condition, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    """Poll `condition()` until it returns a truthy value; fail with `message` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {value!r})")
        time.sleep(interval)


def scrape(port: int) -> dict[str, float]:
    """The /metrics of a role as {'name{labels}': value}."""
    return samples_of(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


def samples_of(body: str) -> dict[str, float]:
    """A Prometheus text exposition as {'name{labels}': value}: values compared as numbers, not as
    the client library happens to print them (1.0, 1, 1e+00)."""
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def http_status(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


class Proc:
    def __init__(self, popen: subprocess.Popen, metrics_port: int, log_path: Path):
        self.popen, self.metrics_port, self.log_path = popen, metrics_port, log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.popen.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None


class ProcessGroup:
    """Spawns `skiplock` subprocesses (as a user would run them) and kills leftovers."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self._logdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"skiplock-test-logs-{os.getpid()}"
        self._logdir.mkdir(parents=True, exist_ok=True)

    def spawn(self, db_url: str, *args: str, tasks: str = "tests.support.handlers", env: dict | None = None,
              command: str = "worker", cwd: Path = ROOT) -> Proc:
        port = free_port()
        full_env = {
            **child_environment(),
            "SKIPLOCK_DATABASE_URL": db_url,
            "SKIPLOCK_METRICS_PORT": str(port),
            "SKIPLOCK_LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONUNBUFFERED": "1",
        }
        if command == "worker":
            full_env["SKIPLOCK_TASKS"] = tasks
        full_env.update({k: str(v) for k, v in (env or {}).items()})
        log_path = self._logdir / f"{command}-{len(self.procs)}-{time.monotonic_ns()}.log"
        with open(log_path, "wb") as out:
            popen = subprocess.Popen([sys.executable, "-m", "skiplock.cli", command, *args], env=full_env,
                                     stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        proc = Proc(popen, port, log_path)
        self.procs.append(proc)
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 20) -> None:
        def ready():
            if not proc.alive():
                raise AssertionError(f"process exited early ({proc.popen.returncode}):\n{proc.log()[-3000:]}")
            try:
                return http_status(proc.metrics_port, "/readyz") == 200
            except OSError:
                return False

        wait_for(ready, timeout, message=f"pid {proc.pid} ready")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                try:
                    proc.popen.send_signal(signal.SIGCONT)
                    proc.popen.kill()
                    proc.popen.wait(10)
                except OSError:
                    pass


# ---- helpers for tests/acceptance and tests/reliability (appended) -------------------------------

def scalar(conn, sql: str, params=None):
    """The first column of the first row of `sql` on an autocommit connection."""
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def parse_labels(text: str) -> dict[str, str]:
    """'a="x",b="y"' -> {'a': 'x', 'b': 'y'} (label values here never hold quotes or commas)."""
    labels = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        labels[key.strip()] = value.strip().strip('"')
    return labels


def sample(samples: dict[str, float], name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` whose labels are exactly `labels`; None if none."""
    found = [value for key, value in samples.items()
             if key.partition("{")[0] == name and parse_labels(key.partition("{")[2].rstrip("}")) == labels]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
    return found[0] if found else None


def metric(samples_or_port, name: str, **labels) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None if there is none.

    Takes the dict returned by scrape(), or a port to scrape."""
    samples = scrape(samples_or_port) if isinstance(samples_or_port, int) else samples_or_port
    total, found = 0.0, False
    for key, value in samples.items():
        sample_name, _, rest = key.partition("{")
        if sample_name != name:
            continue
        have = parse_labels(rest.rstrip("}"))
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
            found = True
    return total if found else None


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def wait_exit(proc: "Proc", timeout: float) -> tuple[int, float]:
    """Wait for `proc` to exit; returns (exit code, seconds waited). Fails after `timeout`."""
    start = time.monotonic()
    try:
        code = proc.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"pid {proc.pid} still running after {timeout}s:\n{proc.log()[-3000:]}") from None
    return code, time.monotonic() - start


def db_clock(conn):
    """The database server's clock_timestamp() (task_events.at and executions.at use that clock)."""
    return scalar(conn, "SELECT clock_timestamp()")


def state_counts(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT state, count(*) FROM skiplock.tasks GROUP BY state").fetchall())

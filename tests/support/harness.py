"""Test helpers: waiting on conditions with a deadline, real skiplock processes, metrics scraping."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """The /metrics of a role as {'name{labels}': value}."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
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
              command: str = "worker") -> Proc:
        port = free_port()
        full_env = {
            **os.environ,
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
                                     stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
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

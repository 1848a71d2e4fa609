"""gunicorn, run in-process by `skiplock api`: the master forks the workers, each builds its own
app (and its own connection pool) after the fork. gthread workers: a slow client holds a thread,
not a process, and only until its read deadline (connections.py); the probes are the master's, on
SKIPLOCK_METRICS_PORT (probes.py). SIGTERM stops accepting and lets requests in flight finish within the graceful
timeout (SKIPLOCK_SHUTDOWN_GRACE_SECONDS, below the pod's grace), then exits 0.
"""

from __future__ import annotations

import errno
import socket

from gunicorn.app.base import BaseApplication
from gunicorn.util import parse_address

from ..engine.errors import ConfigError
from ..engine.metrics import listen_failure
from ..engine.settings import API_WORKER_TIMEOUT_SECONDS, ApiSettings, Settings
from .connections import ApiWorker
from .console.session import with_run_key
from .gunicorn_classes import ApiLogger
from .probes import MasterProbes


def _worker_exit(server, worker) -> None:
    from .app import close_app

    if getattr(worker, "wsgi", None) is not None:
        close_app(worker.wsgi)


def _when_ready(server) -> None:
    server.app.probes.start(server)


def _post_fork(server, worker) -> None:
    server.app.probes.close_in_worker()


def _on_exit(server) -> None:
    server.app.probes.stop()


def _child_exit(server, worker) -> None:
    # a dead worker's live-gauge files must not be summed any more (counters stay)
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def check_bind(bind: str) -> None:
    """Refuse a --bind gunicorn could not listen on, in one line, before it starts: gunicorn
    itself retries a taken port for seconds and then exits with log lines, not a reason."""
    try:
        address = parse_address(bind)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"--bind {bind}: {exc} (use HOST:PORT, e.g. 0.0.0.0:8080)") from None
    if not isinstance(address, tuple):  # unix:PATH or fd://N: gunicorn reports those itself
        return
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
            probe.bind((host, port))
    except OSError as exc:
        hint = "pick a free port with --bind HOST:PORT" if exc.errno == errno.EADDRINUSE else "check --bind"
        raise ConfigError(f"--bind {bind}: {listen_failure(host or '0.0.0.0', port, exc)}; {hint}") from None


class ApiServer(BaseApplication):
    def __init__(self, settings: Settings | ApiSettings, *, bind: str, workers: int, threads: int):
        # here in the master: the workers it forks share the run's console key (auth disabled)
        self.settings = settings = with_run_key(ApiSettings.of(settings))
        self.probes = MasterProbes(settings)  # /healthz, /readyz, /metrics on SKIPLOCK_METRICS_PORT
        self.options = dict(
            # gthread with read deadlines, its own refusals in the API's JSON shape; its log lines
            # through ours
            bind=[bind], workers=workers, worker_class=ApiWorker, threads=threads,
            worker_connections=settings.api_max_connections,
            logger_class=ApiLogger,
            # whole seconds for gunicorn; rounded down, so still below the pod's grace
            graceful_timeout=max(1, int(settings.shutdown_grace_seconds)), timeout=API_WORKER_TIMEOUT_SECONDS,
            keepalive=5,
            accesslog=None, errorlog="-", loglevel=settings.log_level.lower(), proc_name="skiplock-api",
            worker_exit=_worker_exit, child_exit=_child_exit,
            when_ready=_when_ready, post_fork=_post_fork, on_exit=_on_exit,
            # gunicorn >= 25 opens a control socket at a fixed path by default; two APIs on one
            # host would fight over it, and nothing here uses it
            control_socket_disable=True,
        )
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self):
        from .app import create_app

        # one pool per worker: as many connections as threads, one spare for /readyz
        return create_app(self.settings, pool_size=self.options["threads"] + 1, request_threads=self.options["threads"])

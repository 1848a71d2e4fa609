"""The API's probes for Kubernetes, on a listener of their own: the gunicorn master serves
/healthz, /readyz and /metrics on SKIPLOCK_METRICS_PORT, as every other role does (engine/metrics.py
MetricsServer, a thread per connection). No client of the API's port can hold this listener: slow
clients fill request threads, heavy submitters the workers' CPU, and neither is the master's.

- /healthz: a gunicorn worker reported in (its heartbeat) within gunicorn's worker timeout.
- /readyz: Postgres answers and no migration is pending (the API port's /readyz means the same).
- /metrics: every worker's samples, summed (api/request_metrics.py).

The listener starts in the master before the first fork; each worker closes its inherited copy
(post_fork) and never serves it. It holds no database connection between probes: a forked worker
would inherit it, and its exit would close the master's session.
"""

from __future__ import annotations

import logging
import time

from ..engine import migrate
from ..engine.errors import SkiplockError
from ..engine.metrics import MetricsServer
from ..engine.settings import ApiSettings
from .request_metrics import render_summed

log = logging.getLogger("skiplock.api")


class _SummedMetrics:
    def render(self) -> bytes:
        return render_summed()


class MasterProbes:
    def __init__(self, settings: ApiSettings):
        """Takes the port now, before gunicorn starts: ConfigError names a port it cannot take."""
        self.settings = settings
        self.arbiter = None
        self.server = MetricsServer(_SummedMetrics(), settings.metrics_port, self.ready, healthy=self.alive)
        self.port = self.server.port

    def start(self, arbiter) -> None:
        """gunicorn's when_ready, in the master: serve from a thread of its own."""
        self.arbiter = arbiter
        self.server.start()
        log.info("probes listening", extra={"port": self.port, "paths": "/healthz /readyz /metrics"})

    def close_in_worker(self) -> None:
        """gunicorn's post_fork: the worker's copy of the listening socket is closed (the thread
        that serves it exists in the master only)."""
        self.server.close()

    def stop(self) -> None:
        if self.arbiter is not None:
            self.server.stop()
        else:
            self.server.close()

    def alive(self) -> bool:
        arbiter = self.arbiter
        if arbiter is None:
            return False
        now = time.monotonic()
        for worker in list(arbiter.WORKERS.values()):
            try:
                if now - worker.tmp.last_update() <= arbiter.timeout:
                    return True
            except (OSError, ValueError):  # a worker exiting right now
                continue
        return False

    def ready(self) -> bool:
        try:
            return not migrate.pending(self.settings.require_database_url(), self.settings.db_schema)
        except SkiplockError:
            return False

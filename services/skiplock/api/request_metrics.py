"""The API's Prometheus metrics: requests by route template, method and status, and their latency;
refused authentications and authorisations by token name and route; with a read replica, which
database served the reads and the replica's lag.

Under gunicorn every worker is a process of its own, so `skiplock api` sets
PROMETHEUS_MULTIPROC_DIR (a fresh directory) before prometheus_client is imported: each worker's
samples go to files there and /metrics adds up all workers. Without it (tests, a single process),
the samples live in this app's own registry. Routes are the URL map's templates
(/v1/tasks/<task_id>), never raw paths, so a scan of random URLs cannot explode the label set.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..engine.metrics import ENQUEUE_DUPLICATES_HELP

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class ApiMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("skiplock_api_requests_total", "HTTP requests served by the API.",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("skiplock_api_request_duration_seconds",
                                 "Time from the request's arrival to its response, by route and status.",
                                 ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=r)
        # token: a configured token's name, or "unknown" for a 401; route: the template
        self.auth_refusals = Counter("skiplock_api_auth_refusals_total",
                                     "Requests refused 401 (no or unknown token) or 403 (role too weak), by token "
                                     "name, route template and status.", ["token", "route", "status"], registry=r)
        # surface: api or console (sign-in); auth_throttle.py
        self.auth_throttled = Counter("skiplock_api_auth_throttled_total",
                                      "Requests refused 429 auth.throttled: their address presented more wrong tokens "
                                      "than SKIPLOCK_API_MAX_AUTH_FAILURES in a minute.", ["surface"], registry=r)
        # POST /v1/tasks and /v1/tasks:batch with `unique` (the library's count: engine/metrics.py)
        self.enqueue_duplicates = Counter("skiplock_enqueue_duplicates_total", ENQUEUE_DUPLICATES_HELP, ["kind"],
                                          registry=r)
        # with SKIPLOCK_READ_DATABASE_URL only (api/replica.py)
        self.reads = Counter("skiplock_api_reads_total",
                             "Requests to routes a read replica may serve, by the database that served them "
                             "(replica, primary) and why (ok; requested, not_replayed, unreachable, lagging).",
                             ["database", "reason"], registry=r)
        # each gunicorn worker measures it while reads come; the highest of the live workers' is exported
        self.replica_lag = Gauge("skiplock_api_replica_lag_seconds",
                                 "How far the read replica was behind the primary when last measured: the age of the "
                                 "oldest primary WAL position it had not replayed.", registry=r,
                                 multiprocess_mode="livemax")

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        labels = (method, route, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)

    def render(self) -> bytes:
        return render_summed(self.registry)


def render_summed(registry: CollectorRegistry | None = None) -> bytes:
    """Every worker's samples under gunicorn (the multiprocess directory); else `registry`'s."""
    directory = multiprocess_dir()
    if directory is None:
        return generate_latest(registry or REGISTRY)
    from prometheus_client import multiprocess

    summed = CollectorRegistry()
    multiprocess.MultiProcessCollector(summed, path=directory)
    return generate_latest(summed)

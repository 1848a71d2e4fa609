"""Prometheus metrics of the roles, and the small HTTP server that serves them with /healthz and
/readyz. Metric names are part of the external contract (docs/CONTRACT.md).

Metrics are registered on a per-process registry when `Metrics()` is built, so importing this
module registers nothing and tests can build as many as they like.
"""

from __future__ import annotations

import bisect
import errno
import logging
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .errors import ConfigError

log = logging.getLogger("skiplock.metrics")

_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def observe_many(histogram, amounts) -> None:
    """histogram.observe(a) for every a, with one lock round per touched bucket instead of two
    per value (the worker records a wait and a duration per task, a hundred per round trip).
    Falls back to observe() if prometheus_client's internals are not the ones expected."""
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
    except AttributeError:
        for amount in amounts:
            histogram.observe(amount)
        return
    counts = [0] * len(bounds)
    summed = 0.0
    last = len(bounds) - 1
    for amount in amounts:
        summed += amount
        i = bisect.bisect_left(bounds, amount)  # the first bound >= amount, as observe() picks
        if i <= last and amount == amount:      # NaN: no bucket, as in observe()
            counts[i] += 1
    total.inc(summed)
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.task_reclaims = Counter("skiplock_task_reclaims_total",
                                     "Claims whose lease expired and were taken back (reclaimed).",
                                     ["queue"], registry=r)
        self.tasks_claimed = Counter("skiplock_tasks_claimed_total", "Tasks claimed by workers.",
                                     ["queue"], registry=r)
        self.tasks_finished = Counter("skiplock_tasks_finished_total",
                                      "Executions ended, by outcome (completed, retried, failed, "
                                      "cancelled, checkpoint, released, suspended, abandoned).",
                                      ["queue", "kind", "outcome"], registry=r)
        self.task_duration = Histogram("skiplock_task_duration_seconds", "Handler run time.",
                                       ["queue", "kind"], buckets=_DURATION_BUCKETS, registry=r)
        self.task_wait = Histogram("skiplock_task_wait_seconds",
                                   "Claim time minus the time the task became claimable.",
                                   ["queue"], buckets=_WAIT_BUCKETS, registry=r)
        self.claims_crowded = Counter("skiplock_claims_crowded_total",
                                      "Claims that left a queue out because other claims held each of its "
                                      "lanes (SKIPLOCK_CLAIM_LANES); the worker looked again after a pause.",
                                      registry=r)
        self.outcome_writes_busy = Counter("skiplock_outcome_writes_busy_total",
                                           "Outcomes written again because another transaction held their task's "
                                           "row for the moment: most often another worker's claim that overlapped "
                                           "this one at the queue's head (SKIPLOCK_CLAIM_LANES).",
                                           ["queue"], registry=r)
        self.stale_writes_rejected = Counter("skiplock_stale_writes_rejected_total",
                                             "Fenced writes refused because the claim was lost.",
                                             ["operation"], registry=r)
        self.worker_inflight = Gauge("skiplock_worker_inflight", "Tasks this worker is running.",
                                     registry=r)
        self.pod_deletion_cost_updates = Counter("skiplock_pod_deletion_cost_updates_total",
                                                 "Patches of the worker pod's deletion-cost annotation, "
                                                 "by outcome (ok, error).", ["outcome"], registry=r)
        self.listener_healthy = Gauge("skiplock_listener_healthy",
                                      "1 while the LISTEN connection is up and answering probes.",
                                      ["role"], registry=r)

        # scheduler: schedules and maintenance
        self.queue_oldest_pending_age = Gauge(
            "skiplock_queue_oldest_pending_age_seconds",
            "Age of the oldest task pending (queued, run_after reached, queue and kind not paused; "
            "one a limit holds back counts).",
            ["queue"], registry=r)
        self.queue_tasks = Gauge("skiplock_queue_tasks", "Tasks by queue and state.", ["queue", "state"],
                                 registry=r)
        self.queue_suspended = Gauge("skiplock_queue_suspended_tasks",
                                     "Waiting tasks suspended by durable execution, by why: sleep, signal, "
                                     "tasks (also counted in skiplock_queue_tasks{state=\"waiting\"}).",
                                     ["queue", "reason"], registry=r)
        self.queue_claimable = Gauge("skiplock_queue_claimable_tasks",
                                     "Tasks claimable now, not those a limit holds back (what a worker "
                                     "autoscaler should read).",
                                     ["queue"], registry=r)
        self.queue_throttled = Gauge("skiplock_queue_throttled_tasks",
                                     "Queued tasks a concurrency or rate limit holds back (parked).",
                                     ["queue"], registry=r)
        # flow control, per limited kind (never per concurrency key: keys are unbounded)
        self.tasks_throttled = Gauge("skiplock_tasks_throttled",
                                     "Queued tasks of the kind that its limit holds back.", ["kind"], registry=r)
        self.limit_saturation = Gauge(
            "skiplock_limit_saturation",
            "Live runs of the kind over its concurrency limit times its groups with work (1: every "
            "such group is at its limit).", ["kind"], registry=r)
        self.limit_tokens = Gauge("skiplock_limit_tokens",
                                  "Tokens in the emptiest bucket among the kind's groups with work.",
                                  ["kind"], registry=r)
        self.schedule_fires = Counter("skiplock_schedule_fires_total", "Tasks enqueued by schedules.",
                                      ["schedule"], registry=r)
        self.schedule_lag = Gauge("skiplock_schedule_lag_seconds",
                                  "Fire time minus nominal time of the schedule's last fire.",
                                  ["schedule"], registry=r)
        self.schedule_skips = Counter("skiplock_schedule_skips_total",
                                      "Nominal fire times not fired: overlap skips and catch-up drops.",
                                      ["schedule", "reason"], registry=r)
        self.tasks_deleted = Counter("skiplock_tasks_deleted_total",
                                     "Finished tasks deleted by retention.", ["state"], registry=r)
        self.workers = Gauge("skiplock_workers", "Live workers claiming from the queue (the worker registry).",
                             ["queue"], registry=r)
        self.workers_concurrency = Gauge("skiplock_workers_concurrency",
                                         "Sum of the concurrency of the live workers claiming from the queue.",
                                         ["queue"], registry=r)
        self.workers_removed = Counter("skiplock_workers_removed_total",
                                       "Worker registry rows removed because their heartbeat stopped "
                                       "(the worker died without exiting).", registry=r)

        # dispatcher
        self.outbox_pending = Gauge("skiplock_outbox_pending",
                                    "Webhook deliveries pending or in flight.", registry=r)
        self.outbox_oldest_age = Gauge("skiplock_outbox_oldest_pending_age_seconds",
                                       "Age of the oldest webhook delivery not yet delivered or dead.",
                                       registry=r)
        self.webhook_deliveries = Counter("skiplock_webhook_deliveries_total",
                                          "Delivery attempts by outcome (delivered, retry, dead, gone, released).",
                                          ["outcome"], registry=r)
        self.webhook_delivery_seconds = Histogram("skiplock_webhook_delivery_seconds",
                                                  "Time of one delivery attempt, resolution to response.",
                                                  buckets=_DURATION_BUCKETS, registry=r)

    def watch_pools(self, stats: Callable[[], dict[str, dict[str, int]]]) -> None:
        """Export the database pools' figures, read from `stats()` ({pool name: psycopg_pool's
        get_stats(), with our `exhausted` count}) at every scrape."""
        self.registry.register(_PoolCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PoolCollector:
    """skiplock_db_pool_*: how full each database pool is and how long borrowers wait. A pool at
    its maximum with borrowers waiting, or connection attempts failing, is the sign of a
    connection limit reached (docs/OPERATIONS.md)."""

    _GAUGES = (("connections", "pool_size", "Connections the pool holds (open, or being opened)."),
               ("connections_max", "pool_max", "The most connections the pool may hold."),
               ("connections_idle", "pool_available", "Open connections not lent right now."),
               ("requests_waiting", "requests_waiting", "Borrowers waiting for a connection now."))
    _COUNTERS = (("wait_seconds", "requests_wait_ms", 0.001,
                  "Time borrowers spent waiting for a connection."),
                 ("exhausted", "exhausted", 1,
                  "Borrowers that gave up: no connection came within the pool's timeout."),
                 ("connect_errors", "connections_errors", 1,
                  "Attempts to open a connection that failed (refused, too many clients, ...)."))

    def __init__(self, stats: Callable[[], dict[str, dict[str, int]]]):
        self._stats = stats

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._stats()
        for name, key, help_text in self._GAUGES:
            family = GaugeMetricFamily(f"skiplock_db_pool_{name}", help_text, labels=["pool"])
            for pool, figures in stats.items():
                family.add_metric([pool], figures.get(key, 0))
            yield family
        for name, key, scale, help_text in self._COUNTERS:
            family = CounterMetricFamily(f"skiplock_db_pool_{name}", help_text, labels=["pool"])
            for pool, figures in stats.items():
                family.add_metric([pool], figures.get(key, 0) * scale)
            yield family


def listen_failure(host: str, port: int, exc: OSError) -> str:
    """Why listening on host:port failed, in words a user acts on."""
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use (another process listens on {host}:{port})"
    return f"cannot listen on {host}:{port} ({exc.strerror or exc})"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # seconds a client may leave a read or write waiting: a slow one holds only its thread

    def log_message(self, format, *args):  # scrapes every few seconds: keep them out of the logs
        pass


class MetricsServer:
    """Serves /metrics, /healthz (the process is alive, and `healthy()` is true when given) and
    /readyz (`ready()` is true)."""

    def __init__(self, metrics: Metrics, port: int, ready: Callable[[], bool], host: str = "0.0.0.0",
                 healthy: Callable[[], bool] | None = None):
        self.metrics, self.ready, self.healthy = metrics, ready, healthy
        try:
            self._server = make_server(host, port, self._app, server_class=_Server, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(f"SKIPLOCK_METRICS_PORT={port}: {listen_failure(host, port, exc)}; set "
                              "SKIPLOCK_METRICS_PORT to a free port (0: any free one)") from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self.close()

    def close(self) -> None:
        """Releases the port; alone, for a server that was never started (shutdown() would wait
        for a loop that never ran)."""
        self._server.server_close()

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body, status, ctype = self.metrics.render(), "200 OK", CONTENT_TYPE_LATEST
        elif path == "/healthz":
            ok = self.healthy is None or self.healthy()
            body = b"ok\n" if ok else b"not ok\n"
            status, ctype = ("200 OK" if ok else "503 Service Unavailable"), "text/plain"
        elif path == "/readyz":
            ok = self.ready()
            body = b"ready\n" if ok else b"not ready\n"
            status, ctype = ("200 OK" if ok else "503 Service Unavailable"), "text/plain"
        else:
            body, status, ctype = b"not found\n", "404 Not Found", "text/plain"
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]


_ENQUEUE_DUPLICATES: list = []
_ENQUEUE_DUPLICATES_LOCK = threading.Lock()
ENQUEUE_DUPLICATES_HELP = "Enqueues with unique= that found a task of their key and returned its id, by kind."


def enqueue_duplicates() -> Counter:
    """skiplock_enqueue_duplicates_total of the library's enqueues, on prometheus_client's default
    registry (the application's); registered at the first duplicate, so that importing skiplock
    registers nothing. The API counts its own in its registry (api/request_metrics.py)."""
    with _ENQUEUE_DUPLICATES_LOCK:
        if not _ENQUEUE_DUPLICATES:
            _ENQUEUE_DUPLICATES.append(Counter("skiplock_enqueue_duplicates_total", ENQUEUE_DUPLICATES_HELP, ["kind"]))
        return _ENQUEUE_DUPLICATES[0]

"""The one shutdown contract of every role: a signal only sets a flag; loops check it between
units of work. First SIGTERM/SIGINT: stop taking new work and drain within the grace.
Second: give up draining at once (release what is left) and exit.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger("skiplock.lifecycle")


class Stop:
    """Two flags: `requested` (stop taking work) and `urgent` (stop draining too)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.urgent = threading.Event()
        self._callbacks: list = []

    def on_set(self, callback) -> None:
        """Call `callback()` on every set (e.g. to wake a loop sleeping on its own event)."""
        self._callbacks.append(callback)

    def set(self) -> None:
        if self.requested.is_set():
            self.urgent.set()
        self.requested.set()
        for callback in self._callbacks:
            callback()

    def set_urgent(self) -> None:
        """Stop taking work and stop draining at once: a second signal's effect, in one call
        (a role that knows draining is pointless, e.g. its threads no longer return)."""
        self.urgent.set()
        self.set()

    def is_set(self) -> bool:
        return self.requested.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.requested.wait(timeout)


def install_signal_handlers(stop: Stop) -> None:
    """Route SIGTERM/SIGINT to `stop.set()`.

    A Python signal handler runs on the main thread between two bytecodes of whatever it was
    doing; taking any lock there (an Event's, the logging module's) can wait forever on a lock
    the interrupted code holds. So the handler only writes the signal number to a pipe, and a
    watcher thread does the locking work.
    """
    read_fd, write_fd = os.pipe()

    def watch() -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            for signum in data:
                name = signal.Signals(signum).name
                if stop.requested.is_set():
                    log.warning("second %s: releasing unfinished work now", name)
                else:
                    log.info("%s received: no new work; draining", name)
                stop.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()

    def handler(signum, _frame):
        os.write(write_fd, bytes([signum]))

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_role(settings, name: str, build, *, pool_min: int = 1, pool_max: int = 4, prepare=None,
             worker_connections: bool = False) -> int:
    """The common tail of every role's entry: signals -> metrics -> store -> role -> serve
    /metrics, /healthz, /readyz -> run until stopped. `build(store, metrics, stop)` returns an
    object with `run() -> exit code` and `ready() -> bool`; `prepare(store)` runs first."""
    from .metrics import Metrics, MetricsServer
    from .store import Store
    from .tracing_setup import setup_from_environment

    # OTEL_TRACES_EXPORTER's provider, unless the tasks modules set one (the worker imported them)
    setup_from_environment(name)
    stop = Stop()
    install_signal_handlers(stop)
    metrics = Metrics()
    # the port first: a taken one stops the role before it touches the database (a scheduler would
    # otherwise apply its schedules file, then stop)
    server = MetricsServer(metrics, settings.metrics_port, ready=lambda: False)
    started = False
    try:
        store = Store.pooled(settings.require_database_url(), settings.db_schema, min_size=pool_min,
                      max_size=pool_max, name=name, worker_connections=worker_connections,
                      pooler=settings.database_pooler,
                      # a role that heard nothing for a whole lease has lost its claims: waiting
                      # longer on a silent connection helps no one
                      reply_timeout=settings.lease_seconds).open()
        metrics.watch_pools(store.db.pool_stats)
        try:
            if prepare is not None:
                prepare(store)
            role = build(store, metrics, stop)
            server.ready = role.ready
            server.start()
            started = True
            return role.run()
        finally:
            store.close()
    finally:
        if started:
            server.stop()
        else:
            server.close()

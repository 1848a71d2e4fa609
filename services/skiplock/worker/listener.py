"""The supervised LISTEN connection that wakes a role when work arrives.

A dropped connection raises at once; a half-open one (peer gone without a FIN) is caught by the
periodic probe, which has to cross the network, and by libpq TCP keepalives/user timeout. After
every reconnect the role is woken for a catch-up poll: notifications sent while we were deaf are
lost, the rows are not. `skiplock_listener_healthy{role}` shows the state.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import psycopg

from ..engine import store as store_mod
from ..engine.errors import DatabaseUnavailable
from ..engine.outage import OUTAGE

log = logging.getLogger("skiplock.listener")


class Listener:
    def __init__(self, url: str, channel: str, on_wake: Callable[[str | None], None], stop: threading.Event,
                 healthy_gauge=None, probe_seconds: float = 5.0):
        self.url, self.channel, self.on_wake, self.stop = url, channel, on_wake, stop
        self.gauge = healthy_gauge
        self.probe_seconds = probe_seconds
        self.healthy = False
        self.reconnects = 0
        self._conn: psycopg.Connection | None = None
        self._thread = threading.Thread(target=self._run, name="listener", daemon=True)

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _set_healthy(self, value: bool) -> None:
        self.healthy = value
        if self.gauge is not None:
            self.gauge.set(1 if value else 0)

    def _run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                conn = store_mod.connect(self.url, application_name="skiplock-listener")
                self._conn = conn
                conn.execute(f'LISTEN "{self.channel}"')
                if failures or self.reconnects:
                    log.info("listener reconnected", extra={"channel": self.channel})
                self._set_healthy(True)
                failures = 0
                self.on_wake(None)  # catch-up poll: anything sent while we were not listening
                self._listen(conn)
            except (psycopg.Error, DatabaseUnavailable, OSError) as exc:
                self._set_healthy(False)
                failures += 1
                self.reconnects += 1
                delay = random.uniform(0, min(10.0, 0.2 * 2**failures))
                if failures == 1:
                    # a connection that ended (a backend killed, a server restarted): INFO, since it
                    # reconnects by itself; if the database is away, the outage's line says so
                    log.info("listener connection lost; reconnecting",
                             extra={"error": str(exc).strip()[:300], "retry_in": round(delay, 2)})
                else:  # reconnecting failed: the database is away (engine/outage.py)
                    OUTAGE.failed("listener", str(exc).strip())
                self.stop.wait(delay)
            finally:
                conn_, self._conn = self._conn, None
                if conn_ is not None:
                    try:
                        conn_.close()
                    except Exception:
                        pass
        self._set_healthy(False)

    def _listen(self, conn: psycopg.Connection) -> None:
        last_heard = time.monotonic()
        while not self.stop.is_set():
            # short waits so a stop is noticed promptly
            for note in conn.notifies(timeout=0.5, stop_after=64):
                last_heard = time.monotonic()
                self.on_wake(note.payload)
            if time.monotonic() - last_heard >= self.probe_seconds:
                # quiet for a while: prove the connection still reaches the server
                conn.execute("SELECT 1")
                last_heard = time.monotonic()

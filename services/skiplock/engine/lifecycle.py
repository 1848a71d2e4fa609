"""The one shutdown contract of every role: a signal only sets a flag; loops check it between
units of work. First SIGTERM/SIGINT: stop taking new work and drain within the grace.
Second: give up draining at once (release what is left) and exit.
"""

from __future__ import annotations

import logging
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

    def is_set(self) -> bool:
        return self.requested.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.requested.wait(timeout)


def install_signal_handlers(stop: Stop) -> None:
    def handler(signum, frame):
        name = signal.Signals(signum).name
        if stop.requested.is_set():
            log.warning("second %s: releasing unfinished work now", name)
        else:
            log.info("%s received: no new work; draining", name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)

"""Watching skiplock's backends for lock waits: a sampler of pg_stat_activity, and the lock waits a
server with log_lock_waits wrote to its log. For the many-workers test and its benchmark; it
reads only, and decides nothing."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psycopg

# log_line_prefix = '%m [%p] %a: ' (the application name names the skiplock connection)
LOG_LINE_PREFIX = "%m [%p] %a: "
_WAITING = re.compile(r"\] (?P<app>\S*): LOG:  process \d+ still waiting for (?P<what>.*)")


class LockSampler(threading.Thread):
    """Reads pg_stat_activity of `url`'s database until `stop` is set: the backends whose
    application name starts with `prefix` that wait on a lock (wait_event_type = 'Lock': a row's
    transaction, a tuple, a relation, a relation's extension), and how many were running a
    statement, per sample."""

    def __init__(self, url: str, interval: float = 0.005, prefix: str = "skiplock-"):
        super().__init__(daemon=True)
        self.url, self.interval, self.prefix = url, interval, prefix
        self.stop = threading.Event()
        self.samples = self.busy = self.most_active = 0
        self.waits: list[tuple[str, str, str]] = []  # (application, wait event, statement)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="lock-sampler") as conn:
            while not self.stop.is_set():
                active, waiting = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'active'), "
                    "       array_agg(ARRAY[application_name, wait_event, left(query, 120)]) "
                    "           FILTER (WHERE wait_event_type = 'Lock') "
                    "FROM pg_stat_activity "
                    "WHERE datname = current_database() AND starts_with(application_name, %s) "
                    "  AND pid <> pg_backend_pid()", (self.prefix,)).fetchone()
                self.samples += 1
                self.busy += active > 0
                self.most_active = max(self.most_active, active)
                self.waits.extend(tuple(w) for w in waiting or ())
                time.sleep(self.interval)

    def __enter__(self) -> "LockSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join(10)


def logged_waits(log_path: Path) -> list[tuple[str, str]]:
    """(application, what it waited for) of each 'still waiting for' line in a server log written
    with log_lock_waits and LOG_LINE_PREFIX."""
    return [(m["app"], m["what"]) for m in _WAITING.finditer(Path(log_path).read_text(errors="replace"))]


def is_extension(what: str) -> bool:
    """A wait for a relation's extension lock (a new page at the end of a table or index), as
    pg_stat_activity ('extend') or the log ('... on extension of relation ...') names it."""
    return what == "extend" or " on extension of relation " in what

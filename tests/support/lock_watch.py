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
_LINE = re.compile(r"^\S+ \S+ \S+ \[(?P<pid>\d+)\] (?P<app>\S*): (?P<level>[A-Z]+):  (?P<text>.*)$", re.M)
_WAITING = "still waiting for "


class LockSampler(threading.Thread):
    """Reads pg_stat_activity of `url`'s database until `stop` is set: the backends whose
    application name starts with `prefix` that wait on a lock (wait_event_type = 'Lock': a row's
    transaction, a tuple, a relation, a relation's extension), and how many were running a
    statement, per sample, with the application names of the backends each waits for
    (pg_blocking_pids)."""

    def __init__(self, url: str, interval: float = 0.005, prefix: str = "skiplock-"):
        super().__init__(daemon=True)
        self.url, self.interval, self.prefix = url, interval, prefix
        self.stop = threading.Event()
        self.samples = self.busy = self.most_active = 0
        # (application, wait event, statement, the applications it waits for)
        self.waits: list[tuple[str, str, str, tuple[str, ...]]] = []

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="lock-sampler") as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT a.state, a.wait_event_type = 'Lock', a.application_name, a.wait_event, "
                    "       left(a.query, 120), "
                    "       CASE WHEN a.wait_event_type = 'Lock' THEN ARRAY("
                    "           SELECT b.application_name FROM pg_stat_activity AS b "
                    "           WHERE b.pid = ANY (pg_blocking_pids(a.pid))) END "
                    "FROM pg_stat_activity AS a "
                    "WHERE a.datname = current_database() AND starts_with(a.application_name, %s) "
                    "  AND a.pid <> pg_backend_pid()", (self.prefix,)).fetchall()
                active = sum(state == "active" for state, *_ in rows)
                self.samples += 1
                self.busy += active > 0
                self.most_active = max(self.most_active, active)
                self.waits.extend((app, event, query, tuple(blockers))
                                  for _, waiting, app, event, query, blockers in rows if waiting)
                time.sleep(self.interval)

    def __enter__(self) -> "LockSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join(10)


def logged_waits(log_path: Path) -> list[dict[str, str]]:
    """Each lock wait a server with log_lock_waits and LOG_LINE_PREFIX logged: {app, what (it
    waited for), context (what the backend was doing), statement}."""
    waits: list[dict[str, str]] = []
    latest: dict[str, dict[str, str]] = {}  # by pid: its last wait, to which its next lines belong
    for m in _LINE.finditer(Path(log_path).read_text(errors="replace")):
        pid, level, text = m["pid"], m["level"], m["text"]
        if level == "LOG":
            latest.pop(pid, None)
            if _WAITING in text:
                latest[pid] = {"app": m["app"], "what": text.split(_WAITING, 1)[1], "context": "", "statement": ""}
                waits.append(latest[pid])
        elif pid in latest and level in ("CONTEXT", "STATEMENT"):
            latest[pid][level.lower()] = text
    return waits


def is_extension(what: str) -> bool:
    """A wait for a relation's extension lock (a new page at the end of a table or index), as
    pg_stat_activity ('extend') or the log ('... on extension of relation ...') names it."""
    return what == "extend" or " on extension of relation " in what

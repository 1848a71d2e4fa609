"""Latency recording shared by every system's handler, so all of them are measured the same way.

The producer puts ``{"t0": time.time()}`` in the payload just before the enqueue call; the handler
calls :func:`record` first thing, which appends ``time.time() - t0`` (seconds, one per line) to a
per-process file in ``$BENCH_LATENCY_DIR``. Payloads without ``t0`` (the drain phase's no-ops)
record nothing. The orchestrator reads every file once the phase is over.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, TextIO

_lock = threading.Lock()
_file: TextIO | None = None
_file_pid: int | None = None


def _open() -> TextIO | None:
    global _file, _file_pid
    pid = os.getpid()
    if _file is not None and _file_pid == pid:
        return _file
    directory = os.environ.get("BENCH_LATENCY_DIR")
    if not directory:
        return None
    _file = open(os.path.join(directory, f"lat-{pid}.txt"), "a", buffering=1)  # noqa: SIM115
    _file_pid = pid
    return _file


def record(payload: Any) -> None:
    """Record enqueue->start latency if ``payload`` carries ``t0``; otherwise do nothing."""
    now = time.time()
    if not isinstance(payload, dict):
        return
    t0 = payload.get("t0")
    if t0 is None:
        return
    with _lock:
        f = _open()
        if f is not None:
            f.write(f"{now - float(t0):.6f}\n")


def read_all(directory: str) -> list[float]:
    """Every latency (seconds) recorded under ``directory`` by any process."""
    out: list[float] = []
    for name in sorted(os.listdir(directory)):
        if not name.startswith("lat-"):
            continue
        with open(os.path.join(directory, name)) as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(float(line))
    return out

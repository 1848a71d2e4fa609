"""Probing an HTTP endpoint as the kubelet does, for the API's load tests and its benchmark."""

from __future__ import annotations

import http.client
import time


def probe(host: str, port: int, path: str, timeout: float) -> float:
    """One GET on a fresh connection: the seconds to a 200 answer. A failure, a timeout or any
    other status counts as `timeout`, as a failed probe does for the kubelet."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    started = time.perf_counter()
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return time.perf_counter() - started if response.status == 200 else timeout
    except OSError:
        return timeout
    finally:
        conn.close()


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

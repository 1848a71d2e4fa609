"""How `skiplock api` holds up against slow clients and heavy submitters (issue 23): starts the API
as an operator runs it (2 workers x 4 threads) on a migrated database and reports

- probe latency (p50/p99/max of /healthz and /readyz) while N connections send half a request
  header and go quiet (slowloris);
- probe latency while C concurrent POST /v1/tasks:batch of 1,000 tasks run, and the statuses
  they got (201 / 429 / ...);
- the peak RSS of the gunicorn workers (from /proc) while W concurrent maximum-size batches
  (31 MB) are submitted.

A report, not a test (pytest collects nothing here). Probes go to --probe-port-env's port when
the API serves them on a listener of its own, else to the API's port:

    .venv/bin/python -m tests.benchmarks.api_probes --database-url postgresql://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.pgcluster import free_port
from tests.support.probes import p99, probe

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-submitter-token"
TOKENS = f"bench:submitter:{hashlib.sha256(TOKEN.encode()).hexdigest()}"


def start(database_url: str, port: int, metrics_port: int, env: dict[str, str]) -> subprocess.Popen:
    full = {**os.environ, "SKIPLOCK_DATABASE_URL": database_url, "SKIPLOCK_API_TOKENS": TOKENS,
            "SKIPLOCK_METRICS_PORT": str(metrics_port), "SKIPLOCK_LOG_FORMAT": "text",
            "SKIPLOCK_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT / "services"), **env}
    proc = subprocess.Popen([sys.executable, "-m", "skiplock.cli", "api", "--bind", f"127.0.0.1:{port}",
                             "--workers", "2", "--threads", "4"], env=full, cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("skiplock api did not get ready")


def probe_latencies(base: str, seconds: float, timeout: float) -> dict[str, list[float]]:
    """Probe /healthz and /readyz in turn for `seconds`; a failed probe counts as `timeout`."""
    out: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
    host, port = base.removeprefix("http://").split(":")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in out:
            out[path].append(probe(host, int(port), path, timeout))
        time.sleep(0.05)
    return out


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (f"n={len(ordered)} p50={statistics.median(ordered):.3f}s p99={p99(ordered):.3f}s "
            f"max={ordered[-1]:.3f}s")


def slowloris(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(s)
    return socks


def batch_body(tasks: int, payload_bytes: int) -> bytes:
    filler = "x" * payload_bytes
    return json.dumps({"tasks": [{"kind": "bench.probe", "payload": {"f": filler}} for _ in range(tasks)]}).encode()


def submit_many(base: str, body: bytes, count: int, statuses: Counter) -> list[threading.Thread]:
    def one():
        try:
            r = httpx.post(f"{base}/v1/tasks:batch", content=body, timeout=120,
                           headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            statuses[r.status_code] += 1
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def worker_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--slow", type=int, default=50, help="slowloris connections")
    parser.add_argument("--batches", type=int, default=200, help="concurrent batches of 1,000 tasks")
    parser.add_argument("--big", type=int, default=8, help="concurrent maximum-size batches")
    parser.add_argument("--seconds", type=float, default=10, help="probing time per phase")
    parser.add_argument("--probe-timeout", type=float, default=5)
    parser.add_argument("--probes-on-metrics-port", action="store_true",
                        help="probe SKIPLOCK_METRICS_PORT instead of the API's port")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the API (repeatable)")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    port, metrics_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    probe_base = f"http://127.0.0.1:{metrics_port}" if args.probes_on_metrics_port else base
    proc = start(args.database_url, port, metrics_port, env)
    try:
        print(f"idle: healthz {summary(probe_latencies(probe_base, 2, args.probe_timeout)['/healthz'])}")

        socks = slowloris(port, args.slow)
        result = probe_latencies(probe_base, args.seconds, args.probe_timeout)
        for s in socks:
            s.close()
        for path, samples in result.items():
            print(f"{args.slow} slow connections: {path} {summary(samples)}")
        # the API's own port, after the slow clients: is it serving again?
        print(f"  API port /healthz after: {summary(probe_latencies(base, 1, args.probe_timeout)['/healthz'])}")

        statuses: Counter = Counter()
        threads = submit_many(base, batch_body(1000, 16), args.batches, statuses)
        result = probe_latencies(probe_base, args.seconds, args.probe_timeout)
        for t in threads:
            t.join(180)
        for path, samples in result.items():
            print(f"{args.batches} concurrent batches: {path} {summary(samples)}")
        print(f"  batch statuses: {dict(statuses)}")

        # just under the 32 MiB body limit: 1,000 tasks of ~31 KB payload each
        big = batch_body(1000, 31 * 1024 - 40)
        pids = worker_pids(proc.pid)
        base_rss = {pid: rss_bytes(pid) for pid in pids}
        peak, peak_sum = dict(base_rss), sum(base_rss.values())
        statuses = Counter()
        threads = submit_many(base, big, args.big, statuses)
        while any(t.is_alive() for t in threads):
            now = {pid: rss_bytes(pid) for pid in worker_pids(proc.pid)}
            peak_sum = max(peak_sum, sum(now.values()))
            for pid, value in now.items():
                peak[pid] = max(peak.get(pid, 0), value)
            time.sleep(0.02)
        mib = 1024 * 1024
        print(f"{args.big} concurrent {len(big) / mib:.1f} MiB batches: statuses {dict(statuses)}")
        print(f"  worker RSS before {sum(base_rss.values()) / mib:.0f} MiB, peak {peak_sum / mib:.0f} MiB "
              f"(per-worker peaks: {', '.join(f'{v / mib:.0f}' for v in peak.values())} MiB)")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()

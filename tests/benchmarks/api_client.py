"""The client side of the API phase, run as its own subprocess so a hung phase can be killed.

    python -m tests.benchmarks.api_client OP --base http://127.0.0.1:PORT [--clients C]
                                            [--requests N] [--batches B] [--size S]

``$BENCH_API_TOKEN`` is a bearer token of role submitter. OP is one of:

* ``single``  C threads, each with its own keep-alive httpx client, each sending N
  ``POST /v1/tasks`` (one task per request) back to back; tasks/s = C·N / elapsed;
* ``batch``   B bodies of S tasks each (built and serialized before the clock starts) sent as
  ``POST /v1/tasks:batch`` by C threads sharing the list; tasks/s = B·S / elapsed.

Every thread connects (``GET /healthz``) before the clock starts; the clock stops when the last
response arrived. Any answer but 201 fails the phase. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from typing import Any

import httpx

from tests.benchmarks.child_result import report
from tests.benchmarks.systems import KIND, QUEUE


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    pos = (len(values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _run(base: str, clients: int, work) -> dict[str, Any]:
    """Start `clients` threads running `work(client, latencies)`; time them from a common start."""
    headers = {"Authorization": f"Bearer {os.environ['BENCH_API_TOKEN']}"}
    barrier = threading.Barrier(clients + 1)
    latencies: list[float] = []
    errors: list[str] = []

    def thread() -> None:
        mine: list[float] = []
        try:
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                client.get("/healthz").raise_for_status()  # connected before the clock starts
                barrier.wait()
                work(client, mine)
        except Exception as exc:  # noqa: BLE001 - reported as the phase's error
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()
        finally:
            latencies.extend(mine)

    threads = [threading.Thread(target=thread) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed; first: {errors[0]}")
    return {"seconds": seconds, "requests": len(latencies),
            "p50_ms": _percentile(latencies, 50) * 1000, "p99_ms": _percentile(latencies, 99) * 1000}


def _check(response: httpx.Response) -> None:
    if response.status_code != 201:
        raise RuntimeError(f"{response.request.method} {response.request.url.path}: "
                           f"{response.status_code} {response.text[:300]}")


def single(base: str, clients: int, requests: int) -> dict[str, Any]:
    def work(client: httpx.Client, latencies: list[float]) -> None:
        for i in range(requests):
            t = time.perf_counter()
            r = client.post("/v1/tasks", json={"kind": KIND, "queue": QUEUE, "payload": {"i": i}})
            latencies.append(time.perf_counter() - t)
            _check(r)

    return {"n": clients * requests, **_run(base, clients, work)}


def batch(base: str, clients: int, batches: int, size: int) -> dict[str, Any]:
    bodies: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    for b in range(batches):
        tasks = [{"kind": KIND, "queue": QUEUE, "payload": {"i": b * size + i}} for i in range(size)]
        bodies.put(json.dumps({"tasks": tasks}).encode())

    def work(client: httpx.Client, latencies: list[float]) -> None:
        while True:
            try:
                body = bodies.get_nowait()
            except queue.Empty:
                return
            t = time.perf_counter()
            r = client.post("/v1/tasks:batch", content=body, headers={"Content-Type": "application/json"})
            latencies.append(time.perf_counter() - t)
            _check(r)
            if r.json()["created"] != size:
                raise RuntimeError(f"a batch of {size} created {r.json()['created']}")

    return {"n": batches * size, **_run(base, clients, work)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.api_client")
    parser.add_argument("op", choices=["single", "batch"])
    parser.add_argument("--base", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500, help="single: requests per client")
    parser.add_argument("--batches", type=int, default=10, help="batch: how many batch requests")
    parser.add_argument("--size", type=int, default=1000, help="batch: tasks per batch request")
    args = parser.parse_args()
    if args.op == "single":
        return report(lambda: single(args.base, args.clients, args.requests))
    return report(lambda: batch(args.base, args.clients, args.batches, args.size))


if __name__ == "__main__":
    sys.exit(main())

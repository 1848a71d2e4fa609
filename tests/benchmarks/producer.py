"""The enqueue side of every phase, run as its own subprocess so a hung phase can be killed.

    python -m tests.benchmarks.producer SYSTEM OP [--n N] [--chunk C] [--rate R]

``$BENCH_DB_URL`` names the database. OP is one of:

* ``setup``   install the system's schema (its own installer);
* ``single``  N calls of ``enqueue``, one task each (one transaction each), timed;
* ``bulk``    N tasks through ``enqueue_many`` in calls of C tasks, timed;
* ``latency`` N calls of ``enqueue`` paced at R per second, each payload ``{"t0": time.time()}``
  taken right before its call.

Connection setup is outside the timed region. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from tests.benchmarks import systems
from tests.benchmarks.child_result import report


async def _main(args: argparse.Namespace) -> dict[str, object]:
    system = systems.make(args.system, systems.WorkerSettings())
    if args.op == "setup":
        t = time.perf_counter()
        await system.setup()
        return {"seconds": time.perf_counter() - t}

    async with system.producer() as producer:
        if args.op == "single":
            payloads = [{"i": i} for i in range(args.n)]
            t = time.perf_counter()
            for p in payloads:
                await producer.enqueue(p)
            seconds = time.perf_counter() - t
            return {"n": args.n, "seconds": seconds}

        if args.op == "bulk":
            payloads = [{"i": i} for i in range(args.n)]
            chunks = [payloads[i : i + args.chunk] for i in range(0, args.n, args.chunk)]
            t = time.perf_counter()
            for chunk in chunks:
                await producer.enqueue_many(chunk)
            seconds = time.perf_counter() - t
            return {"n": args.n, "seconds": seconds, "calls": len(chunks)}

        if args.op == "latency":
            interval = 1.0 / args.rate
            start = time.perf_counter()
            worst_lag = 0.0
            for i in range(args.n):
                due = start + i * interval
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    worst_lag = max(worst_lag, -delay)
                await producer.enqueue({"t0": time.time(), "i": i})
            seconds = time.perf_counter() - start
            return {
                "n": args.n,
                "seconds": seconds,
                "achieved_rate": args.n / seconds if seconds > 0 else None,
                "worst_lag_s": worst_lag,
            }

    raise SystemExit(f"unknown op {args.op!r}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.producer")
    parser.add_argument("system", choices=sorted(systems.SYSTEMS))
    parser.add_argument("op", choices=["setup", "single", "bulk", "latency"])
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0)
    args = parser.parse_args()
    return report(lambda: asyncio.run(_main(args)))


if __name__ == "__main__":
    sys.exit(main())

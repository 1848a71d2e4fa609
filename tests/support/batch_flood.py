"""`python -m tests.support.batch_flood BASE TOKEN COUNT BODY_FILE`: COUNT concurrent
POST /v1/tasks:batch of the body in BODY_FILE, released together; prints one JSON line with the
statuses and the 429 answers' codes, messages and Retry-After. A process of its own, so that a test
timing probes meanwhile does not share its interpreter with these threads."""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter

import httpx


def main(base: str, token: str, count: int, body_file: str) -> None:
    body = open(body_file, "rb").read()
    statuses: Counter = Counter()
    refused: list[dict] = []
    barrier = threading.Barrier(count)

    def one():
        barrier.wait()
        try:
            r = httpx.post(f"{base}/v1/tasks:batch", content=body, timeout=120,
                           headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1
            return
        statuses[str(r.status_code)] += 1
        if r.status_code == 429:
            refused.append({**r.json()["error"], "retry_after": r.headers.get("Retry-After")})

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    print(json.dumps({"statuses": statuses, "refused": refused}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])

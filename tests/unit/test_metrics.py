"""observe_many() records exactly what one observe() per value would."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from skiplock.engine.metrics import observe_many

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1, 10)
VALUES = [0.0, 0.0005, 0.001, 0.0010001, 0.005, 0.05, 0.1, 1.0, 9.99, 10.0, 11.0, 1e9, -1.0, math.nan]


def _exposition(fill) -> bytes:
    registry = CollectorRegistry()
    hist = Histogram("h_seconds", "h", ["queue"], buckets=BUCKETS, registry=registry)
    fill(hist.labels("q"))
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def test_observe_many_matches_observe():
    def one_by_one(child):
        for value in VALUES:
            child.observe(value)

    assert _exposition(lambda child: observe_many(child, VALUES)) == _exposition(one_by_one)


def test_observe_many_of_nothing_changes_nothing():
    assert _exposition(lambda child: observe_many(child, [])) == _exposition(lambda child: None)

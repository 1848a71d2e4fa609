"""Backoff math: exponential ceiling, full jitter inside [0, ceiling], a cap; a role's count of
failures in a row."""

from __future__ import annotations

import random
import statistics

from skiplock.engine.model import RetryPolicy
from skiplock.engine.errors import ConnectionLost, DatabaseUnavailable, StatementTimeout
from skiplock.engine.retry import backoff_ceiling, failures_after, retry_delay


def test_ceiling_doubles_until_the_cap():
    policy = RetryPolicy(base=2, cap=900)
    assert [backoff_ceiling(policy, n) for n in range(1, 12)] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
    assert backoff_ceiling(policy, 10_000) == 900  # no overflow


def test_delays_stay_inside_the_window_and_are_spread():
    policy = RetryPolicy(base=2, cap=60)
    rng = random.Random(7)
    for attempt in range(1, 10):
        ceiling = min(60, 2 * 2 ** (attempt - 1))
        delays = [retry_delay(policy, attempt, rng) for _ in range(1000)]
        assert all(0 <= d <= ceiling for d in delays)
        # full jitter: spread over the whole window, not clustered at the ceiling
        assert len({round(d, 6) for d in delays}) > 990
        assert min(delays) < ceiling * 0.05 and max(delays) > ceiling * 0.95
        assert abs(statistics.mean(delays) - ceiling / 2) < ceiling * 0.06


def test_a_thousand_simultaneous_failures_do_not_return_together():
    """The seed article's F3 row: with full jitter the 100 ms peak is a small fraction of 1000."""
    policy = RetryPolicy(base=1, cap=30)
    rng = random.Random(11)
    delays = [retry_delay(policy, 1, rng) for _ in range(1000)]
    buckets: dict[int, int] = {}
    for d in delays:
        buckets[int(d * 10)] = buckets.get(int(d * 10), 0) + 1
    assert max(buckets.values()) < 200  # without jitter all 1000 land in one bucket


def test_a_lost_connection_counts_as_a_first_failure():
    # a storm of ended backends builds no backoff: the next unit takes another connection
    assert failures_after(0, ConnectionLost("terminating connection")) == 1
    assert failures_after(7, ConnectionLost("terminating connection")) == 1
    # a database that refuses, times out or is unreachable: one more each time
    assert failures_after(7, DatabaseUnavailable("no database connection available")) == 8
    assert failures_after(2, StatementTimeout("canceling statement")) == 3

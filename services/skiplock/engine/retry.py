"""Retry delay math: exponential backoff with full jitter and a cap; how a role counts its
failures in a row.

delay(n) is uniform in [0, min(cap, base * 2**(n-1))] for the n-th failed attempt. Full jitter
spreads a thousand simultaneous failures over the whole window instead of returning them together.
"""

from __future__ import annotations

import random

from .errors import ConnectionLost
from .model import RetryPolicy

_random = random.SystemRandom()


def backoff_ceiling(policy: RetryPolicy, attempt: int) -> float:
    exponent = max(attempt - 1, 0)
    if exponent > 60:  # 2**60 * base exceeds any sane cap; avoid float overflow
        return policy.cap
    return min(policy.cap, policy.base * (2**exponent))


def retry_delay(policy: RetryPolicy, attempt: int, rng: random.Random = _random) -> float:
    return rng.uniform(0.0, backoff_ceiling(policy, attempt))


def failures_after(failures: int, exc: BaseException) -> int:
    """A role's count of failures in a row once `exc` has failed its unit of work, for its
    backoff. A connection Postgres ended while in use (ConnectionLost) counts as a first failure,
    however many came before: the next unit takes another connection, and if none can be had the
    borrow itself waits, so a storm of ended backends leaves no long pause behind it. Any other
    failure adds one."""
    return 1 if isinstance(exc, ConnectionLost) else failures + 1

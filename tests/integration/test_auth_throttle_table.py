"""api/auth_throttle.py's table of blocked addresses, on a real database: an ended block is
dropped when many addresses are blocked, not only when its address comes back (a guesser with
many addresses would grow the table otherwise). Across API processes: tests/acceptance/test_auth_throttle.py."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from skiplock.api import auth_throttle
from skiplock.api.auth_throttle import AuthThrottle, AuthThrottled


def test_ended_blocks_are_dropped_when_many_addresses_are_blocked(store, monkeypatch):
    monkeypatch.setattr(auth_throttle, "FORGET_AT", 10)
    counter = Counter("t_auth_throttled", "t", ["surface"], registry=CollectorRegistry())
    throttle = AuthThrottle(store, max_failures=1, counter=counter, window_seconds=0.5)
    for n in range(10):
        throttle.failed(f"10.0.0.{n}", "api")  # the first wrong token of each: counted, a 401
        with pytest.raises(AuthThrottled):
            throttle.failed(f"10.0.0.{n}", "api")
    assert len(throttle._blocked) == 10
    time.sleep(0.6)  # every one of those blocks has ended
    throttle.failed("10.0.1.1", "api")
    with pytest.raises(AuthThrottled):
        throttle.failed("10.0.1.1", "api")
    assert list(throttle._blocked) == ["10.0.1.1"]
    with pytest.raises(AuthThrottled):
        throttle.check("10.0.1.1", "api")
    throttle.check("10.0.0.3", "api")  # its block ended: served
    assert counter.labels("api")._value.get() == 12

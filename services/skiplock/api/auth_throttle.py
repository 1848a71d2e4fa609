"""Wrong tokens, throttled per client address: the API's and the console's sign-in.

Each wrong token (an Authorization header or a sign-in form whose token matches none) is counted
in Postgres (auth_failures), so the count holds across every gunicorn worker and every API pod.
Past SKIPLOCK_API_MAX_AUTH_FAILURES in a minute, the wrong token answers 429 `auth.throttled`
with `Retry-After` (the rest of the minute) instead of 401, and this process then refuses every
request of that address, right token or not, until the minute ends: guessing goes no faster
than the bound, whichever worker a guess reaches (each worker learns of the block at the first
wrong token it sees past the bound, so at most one guess per worker more). A right token from
another address is never touched, and a request with no token is not a guess (a 401 as before).

The first refusal of a block writes one audit row (`auth.throttled`, the address as target);
skiplock_api_auth_throttled_total counts every refused request. Owned by the ApiContext: one per
process, its table of blocked addresses behind a lock.
"""

from __future__ import annotations

import math
import threading
import time

from ..engine.errors import TooManyRequests
from ..engine.store import Store

WINDOW_SECONDS = 60.0
# blocked addresses this process keeps before it drops the ended ones (a guesser with many
# addresses would otherwise grow the table until each one came back)
FORGET_AT = 1024


class AuthThrottled(TooManyRequests):
    code = "auth.throttled"


class AuthThrottle:
    def __init__(self, store: Store, max_failures: int, counter, window_seconds: float = WINDOW_SECONDS):
        self.store = store
        self.max_failures = max_failures  # 0: no limit
        self.window_seconds = window_seconds
        self._counter = counter  # skiplock_api_auth_throttled_total{surface}
        self._lock = threading.Lock()
        self._blocked: dict[str, float] = {}  # address -> monotonic end of its block

    def check(self, client: str, surface: str) -> None:
        """Refuse a request of an address this process knows to be blocked."""
        if not self._blocked:  # the common case: one attribute read
            return
        now = time.monotonic()
        with self._lock:
            until = self._blocked.get(client)
            if until is not None and until <= now:
                del self._blocked[client]
                until = None
        if until is not None:
            self._refuse(client, surface, until - now)

    def failed(self, client: str, surface: str) -> None:
        """A wrong token from `client`: counted; past the bound, refused (AuthThrottled)."""
        if self.max_failures <= 0:
            return
        failures, left = self.store.console_sessions.auth_failure_record(client, self.window_seconds)
        if failures <= self.max_failures:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._blocked) >= FORGET_AT:  # many addresses: drop the ended blocks, not only on their return
                self._blocked = {address: until for address, until in self._blocked.items() if until > now}
            self._blocked[client] = now + left
        if failures == self.max_failures + 1:  # the block's first refusal, on whichever process
            self.store.audit.audit_insert(actor="anonymous", action="auth.throttled", target=client,
                                          request_id=None, outcome=AuthThrottled.code,
                                          detail={"failures": failures, "surface": surface})
        self._refuse(client, surface, left)

    def _refuse(self, client: str, surface: str, seconds: float) -> None:
        self._counter.labels(surface).inc()
        raise AuthThrottled(f"too many wrong tokens from {client}: try again in {math.ceil(seconds)} s",
                            retry_after=math.ceil(seconds))

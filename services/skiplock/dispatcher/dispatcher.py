"""The dispatcher role: drains the outbox (webhook_deliveries) to webhook endpoints.

Claims due deliveries with SKIP LOCKED and a lease (a fresh token per claim), sends them
concurrently, signed per Standard Webhooks, to the address the SSRF guard checked, and writes
each outcome fenced by the lease token. At-least-once: an attempt whose dispatcher dies is
claimed again after its lease; `webhook-id` (the event id) lets receivers drop duplicates.

Must not: follow redirects, wait on a receiver beyond the timeouts, or hold a transaction open
while sending.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from urllib.parse import parse_qsl, urlsplit

import httpx

from ..engine.errors import DatabaseUnavailable, InvalidInput
from ..engine.excerpts import excerpt
from ..engine.lifecycle import Stop
from ..engine.metrics import Metrics
from ..engine.retry import failures_after
from ..engine.settings import DispatcherSettings, Settings
from ..engine import tracing
from ..engine.store import Delivery, Store
from ..engine.webhooks import SECRET_PREFIX, AddressGuard, Target, redacted, sign

log = logging.getLogger("skiplock.dispatcher")

# what of a failing receiver's body is read, and the excerpt of it kept in last_error (shown to
# admins): short, printable, one line; a receiver on an allowed network must not be able to
# hand back a page of an internal service through it
ERROR_BODY_BYTES = 512
ERROR_EXCERPT_CHARS = 128
MAX_BACKOFF = 10.0
USER_AGENT = "skiplock-webhooks/1"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one send produced."""

    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    seconds: float = 0.0


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit() also admits '²', which float() refuses
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_excerpt(body: bytes | str) -> str:
    """At most ERROR_EXCERPT_CHARS printable characters of a receiver's error body: control
    characters (newlines, escapes a terminal would obey) become spaces, runs of space one."""
    text = body[:ERROR_BODY_BYTES].decode("utf-8", "replace") if isinstance(body, bytes) else body
    return excerpt(text, ERROR_EXCERPT_CHARS)


def without_secrets(text: str, d: Delivery, target: Target | None = None) -> str:
    """`text` (an httpx error, a receiver's body) without the delivery's URL, the values of its
    query string and userinfo, or its signing secret, should it quote them: they go to
    last_error and to the log."""
    for full in filter(None, (target.connect_url if target else None, d.url)):
        text = text.replace(full, redacted(full))
    parts = urlsplit(d.url)
    values = [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
    values += [parts.password or "", d.secret, d.secret.removeprefix(SECRET_PREFIX)]
    for value in sorted(filter(lambda v: len(v) >= 4, values), key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def decide(attempt: Attempt, attempt_number: int, settings: DispatcherSettings) -> tuple[str, float | None]:
    """(outcome, delay): 'delivered', 'gone' (410: disable the endpoint), 'retry' after delay, or
    'dead' once the attempts are spent."""
    status = attempt.status
    if status is not None and 200 <= status < 300:
        return "delivered", None
    if status == 410:
        return "gone", None
    if attempt_number >= settings.webhook_max_attempts:
        return "dead", None
    cap = settings.webhook_retry_cap_seconds
    if status in (429, 503) and attempt.retry_after is not None:
        return "retry", min(cap, attempt.retry_after)
    # exponential backoff with full jitter: uniform(0, min(cap, base * 2^(n-1)))
    ceiling = min(cap, settings.webhook_retry_base_seconds * 2 ** (attempt_number - 1))
    return "retry", random.uniform(0, ceiling)


class Sender:
    """Sends one delivery. Thread-safe: one pooled httpx client shared by the sending threads."""

    def __init__(self, settings: DispatcherSettings, guard: AddressGuard):
        total = settings.webhook_timeout_seconds
        self.total = total
        self.guard = guard
        # No keep-alive: every attempt gets its own connection, so (1) the deadline watchdog below
        # always knows the socket to cut, and (2) a TLS connection made for one host name is never
        # reused for another name on the same address (connections are made to addresses).
        self.client = httpx.Client(
            timeout=httpx.Timeout(total, connect=min(5.0, total), pool=min(5.0, total)),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=settings.webhook_concurrency * 2, max_keepalive_connections=0),
            headers={"user-agent": USER_AGENT},
            trust_env=False,  # never route deliveries through a proxy from the environment
        )

    def close(self) -> None:
        self.client.close()

    def send(self, d: Delivery) -> Attempt:
        # a client span when a tracer provider is set; the task's traceparent goes along either way
        with tracing.delivery(d.trace_context, url=redacted(d.url), event_type=d.event_type,
                              delivery_id=str(d.id), attempt=d.attempts + 1) as traced:
            return traced.sent(self._send(d, traced.headers))

    def _send(self, d: Delivery, trace_headers: dict[str, str]) -> Attempt:
        started = time.monotonic()
        try:
            target = self.guard.resolve(d.url)  # checked again at every attempt: DNS may have changed
        except InvalidInput as exc:  # its message shows the URL redacted
            return Attempt(error=str(exc), seconds=time.monotonic() - started)
        body = json.dumps(d.payload, separators=(",", ":"), sort_keys=True).encode()
        timestamp = int(time.time())
        message_id = str(d.event_id)
        headers = {
            "host": target.host_header,
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(d.secret, message_id, timestamp, body),  # the body's: not these headers
            **trace_headers,
        }
        deadline = started + self.total
        # httpx's timeouts bound each read, not the request: a receiver trickling a header line
        # every second would hold this thread for ever. A watchdog cuts the socket at the deadline.
        sockets: list[socket.socket] = []
        cut = threading.Event()

        def trace(event: str, info: dict) -> None:
            if event == "connection.connect_tcp.complete" and info.get("return_value") is not None:
                sock = info["return_value"].get_extra_info("socket")
                if sock is not None:
                    sockets.append(sock)

        def cut_off() -> None:
            cut.set()
            for sock in sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        extensions = {"trace": trace}
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), cut_off)
        watchdog.daemon = True
        watchdog.start()
        try:
            # connect to the checked address; speak HTTP (Host, TLS SNI and certificate) to the name
            request = self.client.build_request("POST", target.connect_url, content=body, headers=headers,
                                                extensions=extensions)
            response = self.client.send(request, stream=True)
            try:
                snippet = b""
                if not 200 <= response.status_code < 300:
                    for chunk in response.iter_bytes():
                        snippet += chunk
                        if len(snippet) >= ERROR_BODY_BYTES:
                            break
            finally:
                response.close()
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
            # InvalidURL (a control character in the path) and UnicodeEncodeError (a non-ASCII Host
            # header) are not HTTPErrors: uncaught, one bad endpoint would crash every dispatcher
            if cut.is_set():
                error = f"timed out after {self.total:g}s (SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS)"
            else:
                error = f"{type(exc).__name__}: {without_secrets(str(exc), d, target)}"[:500]
            return Attempt(error=error, seconds=time.monotonic() - started)
        finally:
            watchdog.cancel()
        status = response.status_code
        error = None
        if not 200 <= status < 300:
            text = error_excerpt(without_secrets(snippet[:ERROR_BODY_BYTES].decode("utf-8", "replace"), d))
            error = f"HTTP {status}" + (f": {text}" if text else "")
            if 300 <= status < 400:
                error += f" (redirect to {redacted(response.headers.get('location', '?'))} not followed)"
        return Attempt(status=status, error=error, retry_after=parse_retry_after(response.headers.get("retry-after")),
                       seconds=time.monotonic() - started)


class Dispatcher:
    def __init__(self, settings: Settings | DispatcherSettings, store: Store, metrics: Metrics | None = None,
                 stop: Stop | None = None, *, log_attempts: bool = True):
        # the dispatcher's variables, and no other (engine/settings: each Variable names its roles)
        self.settings = settings = DispatcherSettings.of(settings)
        # False (`skiplock dev`, where the log is a terminal): an attempt that delivers or will be
        # retried is logged at DEBUG; a delivery's end (dead, gone) is still a warning
        self.log_attempts = log_attempts
        self.store = store
        self.metrics = metrics or Metrics()
        self.stop = stop or Stop()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        guard = AddressGuard.from_settings(settings, resolve_timeout=min(5.0, settings.webhook_timeout_seconds))
        self.sender = Sender(settings, guard)
        self.pool = ThreadPoolExecutor(settings.webhook_concurrency, thread_name_prefix="webhook")
        self.counts = {"delivered": 0, "retry": 0, "dead": 0, "gone": 0, "released": 0, "stale": 0}
        # every outcome's series exists from the start at 0, so the dead-letter alert and the
        # dashboard read 0 before the first delivery rather than nothing
        for outcome in ("delivered", "retry", "dead", "gone", "released"):
            self.metrics.webhook_deliveries.labels(outcome)
        for operation in ("delivery_heartbeat", "delivery_settle"):
            self.metrics.stale_writes_rejected.labels(operation)
        self._healthy = False
        self._inflight: dict[Future, Delivery] = {}

    def ready(self) -> bool:
        return self._healthy and not self.stop.is_set()

    def outcomes(self) -> dict[str, int]:
        """Attempts settled so far, by outcome: a copy, for another thread to read."""
        return dict(self.counts)

    # -- one unit of work, for tests and for the loop
    def run_once(self) -> dict[str, int]:
        """Claim what is due (up to the concurrency), send it all, write the outcomes."""
        before = dict(self.counts)
        claimed = self.store.webhooks.webhook_delivery_claim(self.settings.webhook_concurrency, self.owner,
                                                             self.settings.webhook_lease_seconds)
        futures = {self.pool.submit(self.sender.send, d): d for d in claimed}
        wait(futures)
        self._settle([(d, f.result()) for f, d in futures.items()])
        return {k: self.counts[k] - before[k] for k in self.counts if self.counts[k] != before[k]}

    # -- the loop
    def run(self) -> int:
        s = self.settings
        log.info("dispatcher started", extra={"owner": self.owner, "concurrency": s.webhook_concurrency})
        failures = 0
        next_heartbeat = time.monotonic() + s.webhook_lease_seconds / 3
        next_stats = 0.0
        try:
            while not self.stop.is_set():
                try:
                    free = s.webhook_concurrency - len(self._inflight)
                    claimed = (self.store.webhooks.webhook_delivery_claim(free, self.owner, s.webhook_lease_seconds)
                               if free else [])
                    for d in claimed:
                        self._inflight[self.pool.submit(self.sender.send, d)] = d
                    if time.monotonic() >= next_heartbeat:
                        next_heartbeat = time.monotonic() + s.webhook_lease_seconds / 3
                        self._heartbeat()
                    if time.monotonic() >= next_stats:
                        next_stats = time.monotonic() + 5.0
                        self._export_stats()
                    self._healthy, failures = True, 0
                except DatabaseUnavailable as exc:
                    self._healthy = False
                    failures = failures_after(failures, exc)
                    pause = random.uniform(0, min(MAX_BACKOFF, 0.5 * 2 ** failures))
                    log.warning("database unavailable; retrying", extra={"error": str(exc)[:300],
                                                                         "retry_in": round(pause, 2)})
                    self.stop.wait(pause)
                    continue
                # wait for a send to finish, or the poll interval when idle; a full batch loops at once
                timeout = 0 if claimed and len(claimed) == free else s.poll_seconds
                if self._inflight:
                    done, _ = wait(list(self._inflight), timeout=timeout, return_when=FIRST_COMPLETED)
                    self._collect(done)
                else:
                    self.stop.wait(timeout)
        finally:
            self._drain()
        log.info("dispatcher stopped", extra=dict(self.counts))
        return 0

    def _collect(self, done) -> None:
        finished = [(self._inflight.pop(f), f.result()) for f in done]
        for _ in range(3):
            try:
                self._settle(finished)
                return
            except DatabaseUnavailable as exc:
                log.warning("cannot write delivery outcomes yet", extra={"error": str(exc)[:300]})
                time.sleep(1)
        # the leases will expire and another attempt will be made: at-least-once holds

    def _drain(self) -> None:
        """Shutdown: no new claims; let in-flight sends finish within the grace, release the rest."""
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        while self._inflight and not self.stop.urgent.is_set() and time.monotonic() < deadline:
            done, _ = wait(list(self._inflight), timeout=min(0.2, max(0.0, deadline - time.monotonic())),
                           return_when=FIRST_COMPLETED)
            self._collect(done)
        left = list(self._inflight.values())
        self._inflight.clear()
        if left:
            try:
                applied = self.store.webhooks.webhook_delivery_settle([
                    {"id": d.id, "token": d.lease_token, "outcome": "released"} for d in left])
                self.counts["released"] += len(applied)
                self.metrics.webhook_deliveries.labels("released").inc(len(applied))
            except DatabaseUnavailable:
                pass  # their leases expire and another dispatcher takes them
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.sender.close()

    def _heartbeat(self) -> None:
        leases = [(d.id, d.lease_token) for d in self._inflight.values()]
        if leases:
            held = self.store.webhooks.webhook_delivery_heartbeat(leases, self.settings.webhook_lease_seconds)
            lost = len(leases) - len(held)
            if lost:
                self.metrics.stale_writes_rejected.labels("delivery_heartbeat").inc(lost)

    def _export_stats(self) -> None:
        pending, age = self.store.webhooks.outbox_stats()
        self.metrics.outbox_pending.set(pending)
        self.metrics.outbox_oldest_age.set(age)

    def _settle(self, finished: list[tuple[Delivery, Attempt]]) -> None:
        if not finished:
            return
        outcomes, gone = [], []
        for d, attempt in finished:
            number = d.attempts + 1
            outcome, delay = decide(attempt, number, self.settings)
            self.metrics.webhook_delivery_seconds.observe(attempt.seconds)
            if outcome == "gone":
                gone.append(d)
            outcomes.append({"id": d.id, "token": d.lease_token,
                             "outcome": "dead" if outcome == "gone" else outcome,
                             "status": attempt.status, "error": attempt.error, "delay": delay})
            level = logging.INFO if outcome == "delivered" else logging.WARNING
            if not self.log_attempts and outcome in ("delivered", "retry"):
                level = logging.DEBUG
            log.log(level, f"delivery {outcome}", extra={
                "delivery_id": str(d.id), "event_id": str(d.event_id), "endpoint_id": str(d.endpoint_id),
                "attempt": number, "status": attempt.status, "error": attempt.error,
                "retry_in": None if delay is None else round(delay, 3)})
        applied = self.store.webhooks.webhook_delivery_settle(outcomes)
        for o, (d, _) in zip(outcomes, finished):
            if d.id in applied:
                key = "gone" if d in gone else o["outcome"]
                self.counts[key] += 1
                self.metrics.webhook_deliveries.labels(key).inc()
            else:  # its lease expired and another dispatcher holds it now
                self.counts["stale"] += 1
                self.metrics.stale_writes_rejected.labels("delivery_settle").inc()
        self._disable_dying({d.endpoint_id for (d, _), o in zip(finished, outcomes)
                             if o["outcome"] == "dead" and d not in gone and d.id in applied})
        for d in gone:
            try:
                self.store.webhooks.webhook_endpoint_set_enabled(
                    d.endpoint_id, False, reason=f"receiver answered 410 Gone to delivery {d.id}")
                log.warning("endpoint disabled: the receiver answered 410 Gone",
                            extra={"endpoint_id": str(d.endpoint_id), "url": redacted(d.url)})
            except Exception as exc:  # already removed by an operator; nothing to disable
                log.info("could not disable endpoint", extra={"endpoint_id": str(d.endpoint_id), "error": str(exc)})

    def _disable_dying(self, endpoint_ids: set) -> None:
        """Endpoints whose deliveries have only died for SKIPLOCK_WEBHOOK_DISABLE_AFTER_SECONDS are
        disabled with the reason (a receiver gone for good, not down for a deploy)."""
        window = self.settings.webhook_disable_after_seconds
        if not endpoint_ids or window <= 0:
            return
        try:
            disabled = self.store.webhooks.webhook_endpoint_disable_dying(sorted(endpoint_ids, key=str), window)
        except DatabaseUnavailable as exc:  # the next death looks again
            log.warning("could not check endpoints for disabling", extra={"error": str(exc)})
            return
        for endpoint_id, url, reason in disabled:
            log.warning("endpoint disabled: its deliveries only died", extra={
                "endpoint_id": str(endpoint_id), "url": redacted(url), "reason": reason})

"""Webhook logic without a database or a network: event filters, secrets, Standard Webhooks
signatures (checked by an independent verifier written here from the spec), URL parsing, the
SSRF address guard, the retry decision and Retry-After parsing."""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import ipaddress
import random
import time

import pytest

from skiplock.dispatcher.dispatcher import Attempt, decide, parse_retry_after
from skiplock.engine.errors import InvalidInput, WebhookAddressRefused
from skiplock.engine.settings import Settings
from skiplock.engine.webhooks import (ALL_EVENTS, EVENT_TYPES, AddressGuard, check_event_types, check_secret,
                                      generate_secret, sign)


# ---- an independent Standard Webhooks verifier (https://www.standardwebhooks.com/) ----------------

def verify_standard_webhook(secret: str, headers: dict[str, str], body: bytes, *, tolerance: int = 300,
                            now: float | None = None) -> bool:
    """True if `headers` carry a valid v1 signature of `body` under `secret`.

    Written from the spec, not from skiplock's code: the key is the base64 after 'whsec_'; the
    signed content is '{webhook-id}.{webhook-timestamp}.{body}'; the header is a space-separated
    list of '{version},{base64 signature}', any one of which may match; comparison is constant
    time; a timestamp too far from now is rejected (replay protection)."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, timestamp, signatures = lower["webhook-id"], lower["webhook-timestamp"], lower["webhook-signature"]
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance:
        return False
    assert secret.startswith("whsec_")
    key = base64.b64decode(secret.split("_", 1)[1])
    content = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest())
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return True
    return False


# ---- event types ----------------------------------------------------------------------------------

def test_event_types_exact_names_and_wildcard():
    assert check_event_types(["task.completed", "task.failed"]) == ["task.completed", "task.failed"]
    assert check_event_types("task.failed, task.completed,task.failed") == ["task.completed", "task.failed"]
    assert check_event_types([ALL_EVENTS]) == [ALL_EVENTS]
    assert check_event_types("task.*") == ["task.*"]
    for name in EVENT_TYPES:
        assert check_event_types([name]) == [name]
    assert {"task.completed", "task.failed", "task.cancelled", "task.retrying", "task.running"} <= set(EVENT_TYPES)


@pytest.mark.parametrize("bad", ["task.done", "completed", "task.", "*", "task.completed.x", "TASK.COMPLETED"])
def test_unknown_event_type_is_refused_naming_it(bad):
    with pytest.raises(InvalidInput) as info:
        check_event_types(["task.completed", bad])
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("empty", ["", " , ", [], None])
def test_empty_event_filter_is_refused(empty):
    with pytest.raises(InvalidInput, match="at least one event type"):
        check_event_types(empty)


# ---- secrets ---------------------------------------------------------------------------------------

def test_generated_secret_round_trips():
    secrets_seen = set()
    for _ in range(20):
        secret = generate_secret()
        assert secret.startswith("whsec_")
        assert check_secret(secret) == secret
        assert len(base64.b64decode(secret[len("whsec_"):], validate=True)) == 32
        secrets_seen.add(secret)
    assert len(secrets_seen) == 20


@pytest.mark.parametrize("bad, fragment", [
    ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with 'whsec_'"),
    ("sk_" + base64.b64encode(b"k" * 32).decode(), "must start with 'whsec_'"),
    ("whsec_not*base64!", "not valid base64"),
    ("whsec_abc", "not valid base64"),  # bad padding
    ("whsec_" + base64.b64encode(b"short").decode(), "5 bytes"),
    ("whsec_" + base64.b64encode(b"k" * 23).decode(), "23 bytes"),
    ("whsec_" + base64.b64encode(b"k" * 65).decode(), "65 bytes"),
    ("whsec_", "0 bytes"),
])
def test_bad_secrets_are_refused(bad, fragment):
    with pytest.raises(InvalidInput) as info:
        check_secret(bad)
    assert fragment in str(info.value)


def test_secret_bounds_are_accepted():
    for n in (24, 64):
        secret = "whsec_" + base64.b64encode(bytes(range(n))).decode()
        assert check_secret(secret) == secret


# ---- signatures -------------------------------------------------------------------------------------

def test_signature_verifies_with_an_independent_implementation():
    # the Standard Webhooks reference test vector
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    msg_id, timestamp = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330
    body = b'{"test": 2432232314}'
    signature = sign(secret, msg_id, timestamp, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}
    assert verify_standard_webhook(secret, headers, body, now=timestamp)


def test_signature_of_generated_secrets_and_tampering():
    secret = generate_secret()
    body = b'{"type":"task.completed","data":{"task_id":"x"}}'
    now = int(time.time())
    good = {"webhook-id": "0b2c4e1e-0000-4000-8000-000000000001", "webhook-timestamp": str(now),
            "webhook-signature": sign(secret, "0b2c4e1e-0000-4000-8000-000000000001", now, body)}
    assert verify_standard_webhook(secret, good, body)
    # several signatures in one header (secret rotation): any one matching is enough
    other = sign(generate_secret(), good["webhook-id"], now, body)
    assert verify_standard_webhook(secret, {**good, "webhook-signature": f"{other} {good['webhook-signature']}"},
                                   body)
    assert verify_standard_webhook(secret, {**good, "webhook-signature": f"v2,abc {good['webhook-signature']}"},
                                   body)
    # anything changed breaks it
    assert not verify_standard_webhook(secret, good, body + b" ")
    assert not verify_standard_webhook(secret, {**good, "webhook-id": "other"}, body)
    assert not verify_standard_webhook(secret, {**good, "webhook-timestamp": str(now + 1)}, body)
    assert not verify_standard_webhook(secret, {**good, "webhook-signature": other}, body)
    assert not verify_standard_webhook(generate_secret(), good, body)
    # a stale timestamp is refused by the verifier (replay)
    old = now - 3600
    stale = {**good, "webhook-timestamp": str(old), "webhook-signature": sign(secret, good["webhook-id"], old, body)}
    assert not verify_standard_webhook(secret, stale, body)


# ---- URL parsing ------------------------------------------------------------------------------------

def test_parse_accepts_http_and_https():
    assert AddressGuard.parse("https://hooks.example.com/in?x=1") == ("https", "hooks.example.com", 443, "/in?x=1")
    assert AddressGuard.parse("http://hooks.example.com") == ("http", "hooks.example.com", 80, "/")
    assert AddressGuard.parse("http://[2001:db8::1]:8080/a") == ("http", "2001:db8::1", 8080, "/a")


@pytest.mark.parametrize("url, fragment", [
    ("ftp://example.com/x", "scheme 'ftp' is not supported"),
    ("file:///etc/passwd", "scheme 'file' is not supported"),
    ("example.com/hook", "is not supported"),
    ("http:///path-only", "no host"),
    ("http://", "no host"),
    ("http://user:pw@example.com/", "credentials in the URL"),
    ("http://user@example.com/", "credentials in the URL"),
    ("http://example.com:99999/", "malformed"),
    ("http://example.com:port/", "malformed"),
    ("http://example.com:-1/", "malformed"),
    ("", "give an http(s) URL"),
    ("http://example.com/" + "a" * 2100, "at most 2048"),
])
def test_parse_refuses_bad_urls(url, fragment):
    with pytest.raises(InvalidInput) as info:
        AddressGuard.parse(url)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


# ---- the address guard (SSRF) ------------------------------------------------------------------------

REFUSED = [
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://[::1]/",
    "http://127.0.0.1:8080/",
    "http://localhost/",  # a name resolving to loopback
    "http://2130706433/",  # 127.0.0.1 as a decimal integer
    "http://0x7f000001/",  # 127.0.0.1 in hex
    "http://127.1/",  # short form
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
    "http://[::ffff:169.254.169.254]/",
    "http://100.64.0.1/",  # shared address space (carrier-grade NAT)
    "http://224.0.0.1/",  # multicast
    "http://[ff02::1]/",  # IPv6 multicast
    "http://[fe80::1]/",  # IPv6 link-local
    "http://[fd00::1]/",  # IPv6 unique local
    "http://0.0.0.0/",
    "http://255.255.255.255/",
]


@pytest.mark.parametrize("url", REFUSED)
def test_guard_refuses_internal_addresses_without_an_allow_list(url):
    guard = AddressGuard()
    with pytest.raises(WebhookAddressRefused) as info:
        guard.resolve(url)
    assert "not a public address" in str(info.value)
    assert "SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS" in str(info.value)


@pytest.mark.parametrize("address", ["10.0.0.1", "169.254.169.254", "::1", "127.0.0.1", "100.64.0.1",
                                     "224.0.0.1", "::ffff:127.0.0.1", "::ffff:10.1.2.3", "fc00::1", "0.0.0.0",
                                     "198.18.0.1", "240.0.0.1"])
def test_permitted_is_false_for_non_public_addresses(address):
    assert not AddressGuard().permitted(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_permitted_is_true_for_public_unicast(address):
    assert AddressGuard().permitted(ipaddress.ip_address(address))


def test_allow_list_admits_its_networks_only():
    guard = AddressGuard(["127.0.0.0/8"])
    target = guard.resolve("http://127.0.0.1:8081/hook?a=b")
    assert (target.scheme, target.host, target.port, target.address, target.path) == \
        ("http", "127.0.0.1", 8081, "127.0.0.1", "/hook?a=b")
    assert target.connect_url == "http://127.0.0.1:8081/hook?a=b"
    assert target.host_header == "127.0.0.1:8081"
    assert guard.permitted(ipaddress.ip_address("127.3.2.1"))
    assert guard.permitted(ipaddress.ip_address("::ffff:127.0.0.1"))  # mapped form of an admitted address
    assert guard.resolve("http://2130706433/").address == "127.0.0.1"
    for still_refused in ("http://10.0.0.1/", "http://169.254.169.254/", "http://[::1]/"):
        with pytest.raises(WebhookAddressRefused):
            guard.resolve(still_refused)


def test_allow_list_of_ipv6_loopback():
    guard = AddressGuard(["::1/128"])
    target = guard.resolve("http://[::1]:9000/x")
    assert target.address == "::1"
    assert target.connect_url == "http://[::1]:9000/x"
    assert target.host_header == "[::1]:9000"


def test_guard_refuses_bad_allow_list_and_unresolvable_names():
    with pytest.raises(InvalidInput, match="not a CIDR network"):
        AddressGuard(["10.0.0.0/33"])
    with pytest.raises(WebhookAddressRefused, match="cannot resolve"):
        AddressGuard().resolve("http://no-such-host.invalid/")


def test_guard_parses_before_resolving():
    with pytest.raises(InvalidInput, match="not supported"):
        AddressGuard(["0.0.0.0/0"]).resolve("ftp://127.0.0.1/")


# ---- decide(): what an attempt's result means ---------------------------------------------------------

SETTINGS = Settings.from_env({})


def test_2xx_is_delivered_on_any_attempt():
    for status in (200, 201, 202, 204, 299):
        for n in (1, 5, 8):
            assert decide(Attempt(status=status), n, SETTINGS) == ("delivered", None)


def test_410_is_gone_on_any_attempt():
    for n in (1, 8):
        assert decide(Attempt(status=410, error="HTTP 410"), n, SETTINGS) == ("gone", None)


def test_retry_after_is_honoured_and_capped():
    for status in (429, 503):
        assert decide(Attempt(status=status, retry_after=120.0), 1, SETTINGS) == ("retry", 120.0)
        assert decide(Attempt(status=status, retry_after=0.0), 3, SETTINGS) == ("retry", 0.0)
        assert decide(Attempt(status=status, retry_after=86400.0), 1, SETTINGS) == ("retry", 21600.0)
    small_cap = SETTINGS.replace(webhook_retry_cap_seconds=30.0)
    assert decide(Attempt(status=429, retry_after=120.0), 1, small_cap) == ("retry", 30.0)
    # Retry-After on another status is not honoured: the usual backoff applies
    outcome, delay = decide(Attempt(status=500, retry_after=6000.0), 1, SETTINGS)
    assert outcome == "retry" and delay <= 60.0


def test_other_failures_retry_with_full_jitter_below_the_exponential_ceiling():
    rng_state = random.getstate()
    try:
        random.seed(4)
        for settings in (SETTINGS, SETTINGS.replace(webhook_retry_base_seconds=0.5, webhook_retry_cap_seconds=20.0)):
            base, cap = settings.webhook_retry_base_seconds, settings.webhook_retry_cap_seconds
            for n in range(1, settings.webhook_max_attempts):
                ceiling = min(cap, base * 2 ** (n - 1))
                for attempt in (Attempt(status=500), Attempt(status=302), Attempt(status=404), Attempt(status=429),
                                Attempt(error="ConnectError: refused"), Attempt(error="ReadTimeout")):
                    delays = []
                    for _ in range(200):
                        outcome, delay = decide(attempt, n, settings)
                        assert outcome == "retry"
                        delays.append(delay)
                    assert all(0 <= d <= ceiling for d in delays), (n, ceiling, max(delays))
                    # full jitter: spread over the whole range, not bunched at the ceiling
                    assert min(delays) < ceiling * 0.25 and max(delays) > ceiling * 0.75
    finally:
        random.setstate(rng_state)


def test_the_default_schedule_is_capped_at_six_hours():
    settings = SETTINGS.replace(webhook_max_attempts=20)
    for _ in range(100):
        assert decide(Attempt(status=500), 15, settings)[1] <= 21600.0
    assert decide(Attempt(status=500), 19, settings)[0] == "retry"


def test_the_default_schedule_retries_over_hours():
    """A receiver down for a deploy or a night still gets its events (issue 35: 8 attempts used to
    be spent within about 80 s). The ceilings of the 11 waits add up to 20.5 h; with full jitter
    the expected span is half of that."""
    ceilings = [min(SETTINGS.webhook_retry_cap_seconds, SETTINGS.webhook_retry_base_seconds * 2 ** (n - 1))
                for n in range(1, SETTINGS.webhook_max_attempts)]
    assert len(ceilings) == 11 and sum(ceilings) == 73_860.0
    rng_state = random.getstate()
    try:
        random.seed(7)
        spans = [sum(decide(Attempt(status=503), n, SETTINGS)[1] for n in range(1, SETTINGS.webhook_max_attempts))
                 for _ in range(1000)]
    finally:
        random.setstate(rng_state)
    spans.sort()
    assert spans[10] > 3 * 3600 and spans[500] > 8 * 3600 and spans[-1] <= 73_860.0  # 1st percentile, median


def test_attempt_12_is_dead_unless_it_succeeded_or_was_gone():
    assert SETTINGS.webhook_max_attempts == 12
    assert decide(Attempt(status=500), 11, SETTINGS)[0] == "retry"
    for attempt in (Attempt(status=500), Attempt(status=429, retry_after=5.0), Attempt(error="ConnectError")):
        assert decide(attempt, 12, SETTINGS) == ("dead", None)
        assert decide(attempt, 13, SETTINGS) == ("dead", None)
    assert decide(Attempt(status=200), 12, SETTINGS) == ("delivered", None)
    assert decide(Attempt(status=410), 8, SETTINGS) == ("gone", None)


# ---- Retry-After -----------------------------------------------------------------------------------

def test_parse_retry_after_seconds():
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-5") is None
    assert parse_retry_after("1.5") is None  # delta-seconds is an integer


def test_parse_retry_after_http_date():
    now = 1_700_000_000.0
    later = email.utils.formatdate(now + 90, usegmt=True)
    assert parse_retry_after(later, now=now) == pytest.approx(90.0)
    earlier = email.utils.formatdate(now - 90, usegmt=True)
    assert parse_retry_after(earlier, now=now) == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 0.0
    assert parse_retry_after("Wed, 99 Foo 2015 07:28:00 GMT", now=now) is None


def test_parse_retry_after_never_raises_on_garbage():
    for value in ("²", "１２０", "1e3", "Retry-After", "Mon, 32 Jan 2024 99:99:99 GMT", "\x00"):
        result = parse_retry_after(value)
        assert result is None or result >= 0


@pytest.mark.parametrize("address", ["64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
                                     "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
                                     "2002:a00:1::1"])  # 6to4 of 10.0.0.1
def test_permitted_refuses_ipv6_forms_embedding_internal_ipv4(address):
    assert not AddressGuard().permitted(ipaddress.ip_address(address))


def test_a_stuck_resolver_is_given_up_on(monkeypatch):
    import socket
    import threading

    from skiplock.engine.errors import WebhookAddressRefused

    release = threading.Event()
    real = socket.getaddrinfo

    def stuck(host, *args, **kwargs):
        if host == "stuck.example.test":
            release.wait(10)
            raise socket.gaierror("never resolved (test)")  # no real lookup: tests stay off the network
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    guard = AddressGuard(resolve_timeout=0.2)
    try:
        with pytest.raises(WebhookAddressRefused, match="resolving 'stuck.example.test' took over 0.2s"):
            guard.resolve("http://stuck.example.test/hook")
    finally:
        release.set()


def test_an_internationalized_host_is_used_in_its_ascii_form():
    assert AddressGuard.parse("https://bücher.example.test/hook") == \
        ("https", "xn--bcher-kva.example.test", 443, "/hook")
    with pytest.raises(InvalidInput, match="not a valid internationalized name"):
        AddressGuard.parse("http://" + "ü" * 70 + ".example.test/")

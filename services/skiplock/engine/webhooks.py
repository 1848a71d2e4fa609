"""Webhook endpoints: validation of what an operator registers, Standard Webhooks signing, and
the address guard that keeps deliveries away from addresses inside the cluster (SSRF).

Shared by the CLI, the API and the dispatcher. No database access here; resolving a host name
is the only I/O (`AddressGuard.resolve`).
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from .errors import InvalidInput, WebhookAddressRefused

# the task event types a subscriber can name (task_events.type, prefixed); 'task.*' means all
EVENT_TYPES = ("task.queued", "task.running", "task.retrying", "task.checkpoint", "task.completed",
               "task.failed", "task.cancelling", "task.cancelled", "task.reclaimed", "task.resumed",
               "task.released")
ALL_EVENTS = "task.*"
SECRET_PREFIX = "whsec_"


def check_event_types(values: Iterable[str] | str | None) -> list[str]:
    if isinstance(values, str):
        values = [v.strip() for v in values.split(",") if v.strip()]
    values = list(values or [])
    if not values:
        raise InvalidInput(f"events: give at least one event type ({ALL_EVENTS} or one of {', '.join(EVENT_TYPES)})")
    for value in values:
        if value != ALL_EVENTS and value not in EVENT_TYPES:
            raise InvalidInput(f"events: unknown event type {value!r} (use {ALL_EVENTS} or one of "
                               f"{', '.join(EVENT_TYPES)})")
    return sorted(set(values))


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def check_secret(secret: str) -> str:
    """A Standard Webhooks secret: 'whsec_' and the base64 of 24-64 random bytes."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise InvalidInput("secret: must start with 'whsec_' followed by base64 (Standard Webhooks); "
                           "omit it to have one generated")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except ValueError:
        raise InvalidInput("secret: the part after 'whsec_' is not valid base64") from None
    if not 24 <= len(key) <= 64:
        raise InvalidInput(f"secret: the key is {len(key)} bytes; use 24 to 64 random bytes")
    return secret


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value: 'v1,' + base64(HMAC-SHA256(key, id.timestamp.body))."""
    key = base64.b64decode(secret[len(SECRET_PREFIX):])
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


@dataclasses.dataclass(frozen=True)
class Target:
    """A checked destination: connect to `address`, but speak HTTP (Host, TLS SNI) to `host`."""

    scheme: str
    host: str
    port: int
    address: str
    path: str  # path and query

    @property
    def connect_url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# name lookups run here so that a caller can stop waiting for one (threads start on first use)
_RESOLVER = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="resolve")


class AddressGuard:
    """Refuses destinations that are not public unicast addresses (loopback, private, link-local
    including cloud metadata at 169.254.169.254, multicast, reserved, shared, unspecified),
    unless an allow-listed network contains them."""

    def __init__(self, allowed_networks: Sequence[str] = (), resolve_timeout: float = 5.0):
        self.resolve_timeout = resolve_timeout
        self.allowed = []
        for net in allowed_networks:
            try:
                self.allowed.append(ipaddress.ip_network(net.strip(), strict=False))
            except ValueError:
                raise InvalidInput(f"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS: {net!r} is not a CIDR network") from None

    @staticmethod
    def parse(url: str) -> tuple[str, str, int, str]:
        """(scheme, host, port, path) of an acceptable URL, or InvalidInput saying why not."""
        if not isinstance(url, str) or not url or len(url) > 2048:
            raise InvalidInput(f"url {url!r}: give an http(s) URL of at most 2048 characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidInput(f"url {url!r}: malformed ({exc})") from None
        if parts.scheme not in ("http", "https"):
            raise InvalidInput(f"url {url!r}: scheme {parts.scheme or '(none)'!r} is not supported; use http or https")
        if not parts.hostname:
            raise InvalidInput(f"url {url!r}: no host")
        if parts.username or parts.password:
            raise InvalidInput(f"url {url!r}: credentials in the URL are not allowed; sign with the secret instead")
        if any(c.isspace() for c in url):
            raise InvalidInput(f"url {url!r}: contains whitespace")
        port = port or (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname
        if not host.isascii():
            # an internationalized name travels as its ASCII (punycode) form: in DNS, Host and SNI
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError:
                raise InvalidInput(f"url {url!r}: host {host!r} is not a valid internationalized name") from None
        return parts.scheme, host, port, path

    def permitted(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if any(address in net for net in self.allowed):
            return True
        if isinstance(address, ipaddress.IPv6Address):
            # IPv6 forms that carry an IPv4 address reach that IPv4 address through a translator:
            # judge the IPv4 address (mapped ::ffff:a.b.c.d, NAT64 64:ff9b::/96, 6to4, Teredo)
            embedded = address.ipv4_mapped or address.sixtofour
            if embedded is None and address in _NAT64:
                embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
            if embedded is None and address.teredo is not None:
                embedded = address.teredo[1]
            if embedded is not None:
                return self.permitted(embedded)
        return address.is_global and not address.is_multicast

    def resolve(self, url: str) -> Target:
        """Resolve the URL's host and pick an address this guard permits. Every address the
        name resolves to must be permitted (a name pointing at one public and one private
        address is refused: which one a client uses is not ours to predict)."""
        scheme, host, port, path = self.parse(url)
        # getaddrinfo has no timeout of its own: a stuck resolver must not hold a sender for ever
        lookup = _RESOLVER.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            infos = lookup.result(timeout=self.resolve_timeout)
        except concurrent.futures.TimeoutError:
            raise WebhookAddressRefused(f"url {url!r}: resolving {host!r} took over "
                                        f"{self.resolve_timeout:g}s") from None
        except (socket.gaierror, UnicodeError) as exc:
            raise WebhookAddressRefused(f"url {url!r}: cannot resolve {host!r} ({exc})") from None
        addresses = []
        for info in infos:
            address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
            if not self.permitted(address):
                raise WebhookAddressRefused(
                    f"url {url!r}: {host} resolves to {address}, which is not a public address; "
                    "allow it with SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS if it is meant")
            addresses.append(str(address))
        if not addresses:
            raise WebhookAddressRefused(f"url {url!r}: {host!r} resolves to no address")
        return Target(scheme, host, port, addresses[0], path)

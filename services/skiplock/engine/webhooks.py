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
EVENT_TYPES = ("task.waiting", "task.queued", "task.running", "task.retrying", "task.checkpoint", "task.completed",
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


# IPv6 prefixes whose last 32 bits are an IPv4 address that a translator (or a dual stack) delivers
# to: the guard judges that IPv4 address
_IPV4_IN_LOW_32 = tuple(ipaddress.ip_network(net) for net in (
    "::/96",             # IPv4-compatible (deprecated, RFC 4291): ::a.b.c.d
    "::ffff:0:0/96",     # IPv4-mapped: ::ffff:a.b.c.d
    "::ffff:0:0:0/96",   # SIIT (RFC 2765): ::ffff:0:a.b.c.d
    "64:ff9b::/96",      # NAT64, the well-known prefix (RFC 6052)
))
# never public, whatever they embed: RFC 8215's local-use NAT64 prefix puts the IPv4 address where
# the operator's prefix length (/48 to /96, RFC 6052) says, so no decoding of it can be trusted;
# site-local fec0::/10 is deprecated (RFC 3879) but still routed inside sites that use it; SRv6
# SIDs 5f00::/16 (RFC 9602) and documentation 3fff::/20 (RFC 9637) came after Python 3.11's
# `is_global` table, which still counts them public
_NEVER_PUBLIC = tuple(ipaddress.ip_network(net) for net in ("64:ff9b:1::/48", "fec0::/10", "5f00::/16",
                                                            "3fff::/20"))

# SKIPLOCK_WEBHOOK_ALLOWED_PORTS by default: 80, 443 and 1024-65535 but these, where databases,
# caches, queues and control planes listen (a delivery's POST must not reach one on an allowed network)
DENIED_PORTS = frozenset({
    1433, 1521,          # SQL Server, Oracle
    2375, 2376,          # Docker daemon
    2379, 2380,          # etcd
    3306,                # MySQL
    5432,                # PostgreSQL
    5672,                # AMQP
    5984,                # CouchDB
    6379,                # Redis
    6443,                # Kubernetes API server
    8200,                # Vault
    8500,                # Consul
    9200, 9300,          # Elasticsearch
    10250, 10255,        # kubelet
    11211,               # memcached
    27017,               # MongoDB
})
DEFAULT_PORTS = "80,443,1024-65535"


def parse_ports(text: str, variable: str = "SKIPLOCK_WEBHOOK_ALLOWED_PORTS") -> frozenset[int]:
    """Ports and inclusive ranges, comma-separated: `80,443,8000-8999`."""
    ports: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise InvalidInput(f"{variable}: {part!r} is not a port or a range like 8000-8999") from None
        if not 1 <= first <= last <= 65535:
            raise InvalidInput(f"{variable}: {part!r} is not within 1-65535")
        ports.update(range(first, last + 1))
    if not ports:
        raise InvalidInput(f"{variable}: list at least one port")
    return frozenset(ports)


def default_ports() -> frozenset[int]:
    return parse_ports(DEFAULT_PORTS) - DENIED_PORTS


def redacted(url: str) -> str:
    """The URL as logs and error messages may show it: no userinfo, and the query string (where
    receivers put access tokens) replaced by `?...`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(a malformed URL)"
    host = f"[{host}]" if ":" in host else host
    scheme = f"{parts.scheme}://" if parts.scheme else ""
    return f"{scheme}{host}{port}{parts.path}" + ("?..." if parts.query else "")


# name lookups run here so that a caller can stop waiting for one (threads start on first use)
_RESOLVER = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="resolve")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries: a translated form's, 6to4's (2002::/16), or
    Teredo's server and client (2001::/32; the client's is the inverted last 32 bits)."""
    if any(address in net for net in _IPV4_IN_LOW_32):
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address.sixtofour is not None:
        return (address.sixtofour,)
    if address.teredo is not None:
        return address.teredo
    return ()


class AddressGuard:
    """Refuses destinations that are not public unicast addresses (loopback, private, link-local
    including cloud metadata at 169.254.169.254, multicast, reserved, shared, unspecified, and
    IPv6 forms of those), unless an allow-listed network contains them; and ports not allowed."""

    def __init__(self, allowed_networks: Sequence[str] = (), resolve_timeout: float = 5.0,
                 allowed_ports: Iterable[int] | None = None):
        self.resolve_timeout = resolve_timeout
        self.allowed_ports = default_ports() if allowed_ports is None else frozenset(allowed_ports)
        self.allowed = []
        for net in allowed_networks:
            try:
                self.allowed.append(ipaddress.ip_network(net.strip(), strict=False))
            except ValueError:
                raise InvalidInput(f"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS: {net!r} is not a CIDR network") from None

    @classmethod
    def from_settings(cls, settings, resolve_timeout: float = 5.0) -> "AddressGuard":
        return cls(settings.webhook_allowed_networks, resolve_timeout, settings.webhook_allowed_ports)

    @staticmethod
    def parse(url: str) -> tuple[str, str, int, str]:
        """(scheme, host, port, path) of an acceptable URL, or InvalidInput saying why not."""
        if not isinstance(url, str) or not url or len(url) > 2048:
            raise InvalidInput(f"url: give an http(s) URL of at most 2048 characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidInput(f"url {redacted(url)!r}: malformed ({exc})") from None
        if parts.scheme not in ("http", "https"):
            raise InvalidInput(f"url {redacted(url)!r}: scheme {parts.scheme or '(none)'!r} is not supported; use http or https")
        if not parts.hostname:
            raise InvalidInput(f"url {redacted(url)!r}: no host")
        if parts.username or parts.password:
            raise InvalidInput(f"url {redacted(url)!r}: credentials in the URL are not allowed; sign with the secret instead")
        if any(c.isspace() for c in url):
            raise InvalidInput(f"url {redacted(url)!r}: contains whitespace")
        if port == 0:  # `port or default` would read it as the scheme's default port
            raise InvalidInput(f"url {redacted(url)!r}: port 0 is not a port a delivery can reach")
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname
        if not host.isascii():
            # an internationalized name travels as its ASCII (punycode) form: in DNS, Host and SNI
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError:
                raise InvalidInput(f"url {redacted(url)!r}: host {host!r} is not a valid internationalized name") from None
        return parts.scheme, host, port, path

    def permitted(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if any(address in net for net in self.allowed):
            return True
        if isinstance(address, ipaddress.IPv6Address):
            if any(address in net for net in _NEVER_PUBLIC):
                return False
            embedded = _embedded_ipv4(address)
            if embedded:  # every IPv4 address the form carries must be permitted
                return all(self.permitted(ipv4) for ipv4 in embedded)
        return address.is_global and not address.is_multicast

    def resolve(self, url: str) -> Target:
        """Resolve the URL's host and pick an address this guard permits. Every address the
        name resolves to must be permitted (a name pointing at one public and one private
        address is refused: which one a client uses is not ours to predict)."""
        scheme, host, port, path = self.parse(url)
        shown = redacted(url)
        if port not in self.allowed_ports:
            raise WebhookAddressRefused(f"url {shown!r}: port {port} is not allowed; allow it with "
                                        "SKIPLOCK_WEBHOOK_ALLOWED_PORTS if it is meant")
        # getaddrinfo has no timeout of its own: a stuck resolver must not hold a sender for ever
        lookup = _RESOLVER.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            infos = lookup.result(timeout=self.resolve_timeout)
        except concurrent.futures.TimeoutError:
            raise WebhookAddressRefused(f"url {shown!r}: resolving {host!r} took over "
                                        f"{self.resolve_timeout:g}s") from None
        except (socket.gaierror, UnicodeError) as exc:
            raise WebhookAddressRefused(f"url {shown!r}: cannot resolve {host!r} ({exc})") from None
        addresses = []
        for info in infos:
            address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
            if not self.permitted(address):
                raise WebhookAddressRefused(
                    f"url {shown!r}: {host} resolves to {address}, which is not a public address; "
                    "allow it with SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS if it is meant")
            addresses.append(str(address))
        if not addresses:
            raise WebhookAddressRefused(f"url {shown!r}: {host!r} resolves to no address")
        return Target(scheme, host, port, addresses[0], path)

"""Refused authentication (401) and authorisation (403), made traceable: the one log line of
each names the client's address and, for a 403, the token's name, and
skiplock_api_auth_refusals_total counts them by token name and route template.

The client's address is the connection's peer, unless that peer is one of the trusted proxies
(SKIPLOCK_API_TRUSTED_PROXIES): then X-Forwarded-For is read from the right, where each trusted
proxy appended the address it saw, up to the first hop that is not a trusted proxy. Entries left
of that one were written by the client and prove nothing. Nothing here decides whether to refuse
(auth.py does).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

from flask import g, request

from ..engine.errors import Forbidden, SkiplockError
from .app_state import api

# the token label of a 401: no token, or one that matches no configured token (the label set
# stays the configured names plus this one, whatever clients send)
UNKNOWN_TOKEN = "unknown"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(value, strict=False) for value in values)


def _address(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address((text or "").strip().split("%", 1)[0])
    except ValueError:
        return None


def client_address(peer: str | None, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The address a request came from, believing X-Forwarded-For only as far as `trusted` reach."""
    address = _address(peer)
    if address is None:
        return peer or "unknown"
    hops = reversed(forwarded_for.split(",")) if forwarded_for and trusted else ()
    for hop in hops:
        if not any(address in net for net in trusted):
            break
        parsed = _address(hop)
        if parsed is None:  # not an address: the nearest trusted proxy's view is all there is
            break
        address = parsed
    return str(address)


def request_client() -> str:
    """The current request's client address (see client_address)."""
    return client_address(request.remote_addr, request.headers.get("X-Forwarded-For"), api().trusted_proxies)


def report(logger: logging.Logger, message: str, exc: SkiplockError, route: str) -> None:
    """Log and count one 401 or 403 of the current request."""
    ctx = api()
    principal = g.get("principal")
    forbidden = isinstance(exc, Forbidden) and principal is not None
    token = principal.name if forbidden else UNKNOWN_TOKEN
    fields = {"code": exc.code, "method": request.method, "path": request.path, "route": route,
              "client": request_client(),
              "request_id": g.get("request_id")}
    if forbidden:
        fields["token"] = principal.name
    logger.warning(message, extra=fields)
    ctx.metrics.auth_refusals.labels(token, route, str(exc.status)).inc()

"""The dispatcher's variables (webhook deliveries: where they may go, how many at once, their
lease, timeout and retries), with the relation between timeout and lease that startup checks.

The API reads the address rules too: it checks an endpoint's URL when the endpoint is added.
It declares; it reads no environment.
"""

from __future__ import annotations

import ipaddress

from ..errors import ConfigError, InvalidInput
from ..webhooks import default_ports, parse_ports
from .declaration import DISPATCHER, Variable, at_least_zero, positive

_D = ("dispatcher", "dev")
_D_AND_API = ("dispatcher", "api", "dev")


def _ports(text: str | None) -> frozenset[int]:
    if text is None:
        return default_ports()
    if isinstance(text, frozenset):  # already parsed (a settings field given directly)
        return text
    try:
        return parse_ports(text)
    except InvalidInput as exc:
        raise ConfigError(str(exc)) from None


def check_networks(variable: Variable, networks) -> None:
    for net in networks:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ConfigError(f"{variable.env}: {net!r} is not a CIDR network (e.g. 10.0.0.0/8)") from None


VARIABLES: tuple[Variable, ...] = (
    Variable("WEBHOOK_ALLOWED_NETWORKS", (), "CIDRs deliveries may reach besides public addresses", DISPATCHER,
             _D_AND_API, kind="names", checker=check_networks,
             more="checked when an endpoint is added and at every attempt; `skiplock dev`: 127.0.0.0/8"),
    Variable("WEBHOOK_ALLOWED_PORTS", None, "ports deliveries may reach: comma-separated ports and ranges "
             "(`80,443,8000-8999`)", DISPATCHER, _D_AND_API, type="frozenset[int]", convert=_ports,
             shown="80, 443 and 1024-65535 except engine/webhooks.py `DENIED_PORTS`",
             more="the default leaves out the ports of databases, caches, queues and control planes "
             "(1433, 1521, 2375-2376, 2379-2380, 3306, 5432, 5672, 5984, 6379, 6443, 8200, 8500, 9200, 9300, "
             "10250, 10255, 11211, 27017); a list that is set is taken as it is", contract=27),
    Variable("WEBHOOK_CONCURRENCY", 16, "requests in flight per dispatcher", DISPATCHER, _D, kind="integer",
             bound=positive("integer")),
    Variable("WEBHOOK_LEASE_SECONDS", 30.0, "lease of a claimed delivery; must exceed the timeout and the "
             "shutdown grace", DISPATCHER, _D, kind="number", bound=positive()),
    Variable("WEBHOOK_TIMEOUT_SECONDS", 10.0, "total time of one attempt (connect ≤ 5 s)", DISPATCHER, _D,
             kind="number", bound=positive()),
    # the defaults retry over hours, as Standard Webhooks' senders do: a receiver down for a deploy
    # or a night gets its events (ceilings 1 min, 2, 4, ... 6 h: about 10 h on average, 20 h at most)
    Variable("WEBHOOK_MAX_ATTEMPTS", 12, "attempts before the dead letter", DISPATCHER, _D, kind="integer",
             bound=positive("integer")),
    Variable("WEBHOOK_RETRY_BASE_SECONDS", 60.0, "backoff base: attempt n waits `uniform(0, min(cap, base·2^(n-1)))`",
             DISPATCHER, _D, kind="number", bound=positive()),
    Variable("WEBHOOK_RETRY_CAP_SECONDS", 21600.0, "backoff cap", DISPATCHER, _D, kind="number", bound=positive()),
    Variable("WEBHOOK_DISABLE_AFTER_SECONDS", 86400.0, "an enabled endpoint none of whose deliveries succeeded for this "
             "long, while they died, is disabled with the reason (audited `webhook.disable`); `0`: never",
             DISPATCHER, _D, kind="number", bound=at_least_zero("(0: never)"), contract=47),
)


def check_relations(s) -> None:
    if s.webhook_timeout_seconds >= s.webhook_lease_seconds:
        raise ConfigError(f"SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS={s.webhook_timeout_seconds:g}: must be < "
                          f"SKIPLOCK_WEBHOOK_LEASE_SECONDS ({s.webhook_lease_seconds:g}), or an attempt "
                          "still sending could be handed to another dispatcher")

"""Settings: every knob comes from SKIPLOCK_* environment variables, parsed once into a frozen
dataclass and validated when built. A bad value fails at startup with the variable's name.

`NAME_FILE` may hold the path of a file whose content is the value (Kubernetes secrets).
This module reads the environment only when `Settings.from_env()` is called.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from typing import NamedTuple

from .errors import ConfigError, InvalidInput
from .webhooks import default_ports, parse_ports

PREFIX = "SKIPLOCK_"
# Validation patterns are applied with fullmatch: `$` alone admits a trailing newline ("q1\n").
# NAME_RE keeps its anchors because the API publishes it as a JSON Schema pattern.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Kubernetes object names: a pod's is a DNS subdomain, a namespace's a DNS label
_POD_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# API roles, weakest first: each can do what the ones before it can
API_ROLES = ("reader", "submitter", "admin")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _ports(text: str | None) -> frozenset[int]:
    if text is None:
        return default_ports()
    try:
        return parse_ports(text)
    except InvalidInput as exc:
        raise ConfigError(str(exc)) from None


def check_name(what: str, value: object, variable: str | None = None) -> str:
    """Queue and kind names: 1-64 of letters, digits, `_ . : -`, starting with a letter or digit.

    Raises ConfigError naming `variable` when the name came from the environment, else InvalidInput.
    """
    if isinstance(value, str) and NAME_RE.fullmatch(value):
        return value
    message = f"invalid {what} name {value!r}: use 1-64 letters, digits, '_', '.', ':' or '-'"
    if variable:
        raise ConfigError(f"{variable}: {message}")
    raise InvalidInput(message)


@dataclasses.dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    db_schema: str = "skiplock"
    tasks: tuple[str, ...] = ()
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 10
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    shutdown_grace_seconds: float = 25.0
    poll_seconds: float = 1.0
    reaper_seconds: float = 5.0
    max_reclaims: int = 10
    max_payload_bytes: int = 1024 * 1024
    claim_batch: int = 0  # 0: as many as free slots
    stuck_grace_seconds: float = 10.0
    metrics_port: int = 9090
    dev_api_port: int = 8080  # `skiplock dev` serves the HTTP API here (0: any free port)
    schedules_file: str | None = None
    schedules_prune: bool = False
    gauges_seconds: float = 15.0
    retention_seconds: float = 60.0
    retain_completed_seconds: float = 86400.0
    retain_failed_seconds: float = 7 * 86400.0
    retain_cancelled_seconds: float = 7 * 86400.0
    retain_audit_seconds: float = 90 * 86400.0
    webhook_allowed_networks: tuple[str, ...] = ()
    webhook_allowed_ports: frozenset[int] = dataclasses.field(default_factory=default_ports)
    webhook_concurrency: int = 16
    webhook_lease_seconds: float = 30.0
    webhook_timeout_seconds: float = 10.0
    webhook_max_attempts: int = 8
    webhook_retry_base_seconds: float = 1.0
    webhook_retry_cap_seconds: float = 900.0
    api_tokens: tuple["ApiToken", ...] = ()
    api_auth: str = "enabled"
    api_trusted_proxies: tuple[str, ...] = ()
    api_statement_timeout_seconds: float = 5.0
    log_format: str = "json"
    log_level: str = "INFO"
    pod_deletion_cost: bool = False
    pod_name: str | None = None
    pod_namespace: str | None = None
    pod_deletion_cost_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not SCHEMA_RE.fullmatch(self.db_schema):
            raise ConfigError(f"SKIPLOCK_DB_SCHEMA: invalid schema name {self.db_schema!r}")
        for q in self.queues:
            check_name("queue", q, "SKIPLOCK_QUEUES")
        if not self.queues:
            raise ConfigError("SKIPLOCK_QUEUES: at least one queue is required")
        if self.concurrency < 1:
            raise ConfigError(f"SKIPLOCK_CONCURRENCY={self.concurrency}: must be a positive integer")
        if self.lease_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_LEASE_SECONDS={self.lease_seconds}: must be > 0")
        if self.heartbeat_seconds <= 0 or self.heartbeat_seconds > self.lease_seconds / 3 + 1e-9:
            raise ConfigError(
                f"SKIPLOCK_HEARTBEAT_SECONDS={self.heartbeat_seconds:g}: must be > 0 and "
                f"<= lease/3 ({self.lease_seconds / 3:g}) so a claim survives two lost heartbeats"
            )
        if self.shutdown_grace_seconds < 0 or self.shutdown_grace_seconds >= self.lease_seconds:
            raise ConfigError(
                f"SKIPLOCK_SHUTDOWN_GRACE_SECONDS={self.shutdown_grace_seconds:g}: must be >= 0 and "
                f"< SKIPLOCK_LEASE_SECONDS ({self.lease_seconds:g}), or drained tasks would be "
                "reclaimed while still running"
            )
        if self.poll_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_POLL_SECONDS={self.poll_seconds:g}: must be > 0")
        if self.reaper_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_REAPER_SECONDS={self.reaper_seconds:g}: must be > 0")
        if self.max_reclaims < 0:
            raise ConfigError(f"SKIPLOCK_MAX_RECLAIMS={self.max_reclaims}: must be >= 0")
        if self.max_payload_bytes < 1:
            raise ConfigError(f"SKIPLOCK_MAX_PAYLOAD_BYTES={self.max_payload_bytes}: must be >= 1")
        if self.claim_batch < 0:
            raise ConfigError(f"SKIPLOCK_CLAIM_BATCH={self.claim_batch}: must be >= 0")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"SKIPLOCK_METRICS_PORT={self.metrics_port}: must be 0-65535")
        if not 0 <= self.dev_api_port <= 65535:
            raise ConfigError(f"SKIPLOCK_DEV_API_PORT={self.dev_api_port}: must be 0-65535")
        for variable, value in (("GAUGES_SECONDS", self.gauges_seconds),
                                ("RETENTION_SECONDS", self.retention_seconds)):
            if value <= 0:
                raise ConfigError(f"SKIPLOCK_{variable}={value:g}: must be > 0")
        for variable, value in (("RETAIN_COMPLETED_SECONDS", self.retain_completed_seconds),
                                ("RETAIN_FAILED_SECONDS", self.retain_failed_seconds),
                                ("RETAIN_CANCELLED_SECONDS", self.retain_cancelled_seconds),
                                ("RETAIN_AUDIT_SECONDS", self.retain_audit_seconds)):
            if value < 0:
                raise ConfigError(f"SKIPLOCK_{variable}={value:g}: must be >= 0 (0 keeps them forever)")
        if self.webhook_concurrency < 1:
            raise ConfigError(f"SKIPLOCK_WEBHOOK_CONCURRENCY={self.webhook_concurrency}: must be a positive integer")
        if self.webhook_max_attempts < 1:
            raise ConfigError(f"SKIPLOCK_WEBHOOK_MAX_ATTEMPTS={self.webhook_max_attempts}: must be a positive integer")
        for variable, value in (("WEBHOOK_LEASE_SECONDS", self.webhook_lease_seconds),
                                ("WEBHOOK_TIMEOUT_SECONDS", self.webhook_timeout_seconds),
                                ("WEBHOOK_RETRY_BASE_SECONDS", self.webhook_retry_base_seconds),
                                ("WEBHOOK_RETRY_CAP_SECONDS", self.webhook_retry_cap_seconds)):
            if value <= 0:
                raise ConfigError(f"SKIPLOCK_{variable}={value:g}: must be > 0")
        if self.webhook_timeout_seconds >= self.webhook_lease_seconds:
            raise ConfigError(f"SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS={self.webhook_timeout_seconds:g}: must be < "
                              f"SKIPLOCK_WEBHOOK_LEASE_SECONDS ({self.webhook_lease_seconds:g}), or an attempt "
                              "still sending could be handed to another dispatcher")
        for variable, networks in (("WEBHOOK_ALLOWED_NETWORKS", self.webhook_allowed_networks),
                                   ("API_TRUSTED_PROXIES", self.api_trusted_proxies)):
            for net in networks:
                try:
                    ipaddress.ip_network(net, strict=False)
                except ValueError:
                    raise ConfigError(f"SKIPLOCK_{variable}: {net!r} is not a CIDR network (e.g. 10.0.0.0/8)") from None
        if self.api_statement_timeout_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS={self.api_statement_timeout_seconds:g}: "
                              "must be > 0")
        if self.api_auth not in ("enabled", "disabled"):
            raise ConfigError(f"SKIPLOCK_API_AUTH={self.api_auth!r}: must be enabled or disabled")
        if self.log_format not in ("json", "text"):
            raise ConfigError(f"SKIPLOCK_LOG_FORMAT={self.log_format!r}: must be json or text")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"SKIPLOCK_LOG_LEVEL={self.log_level!r}: must be a logging level")
        self._check_pod_deletion_cost()

    def _check_pod_deletion_cost(self) -> None:
        if self.pod_deletion_cost_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_POD_DELETION_COST_SECONDS={self.pod_deletion_cost_seconds:g}: must be > 0")
        if not self.pod_deletion_cost:
            return
        for variable, value, pattern, what in (("SKIPLOCK_POD_NAME", self.pod_name, _POD_NAME_RE, "name"),
                                               ("SKIPLOCK_POD_NAMESPACE", self.pod_namespace, _NAMESPACE_RE,
                                                "namespace")):
            if not value:
                raise ConfigError(f"{variable}: required when SKIPLOCK_POD_DELETION_COST is true (set it from "
                                  f"the downward API, fieldRef metadata.{what})")
            if not pattern.fullmatch(value):
                raise ConfigError(f"{variable}={value!r}: not a Kubernetes pod {what}")

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel; one per schema so two installations never wake each other."""
        return f"skiplock_{self.db_schema}"

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigError("SKIPLOCK_DATABASE_URL: required (a libpq URL, e.g. postgresql://user@host/db)")
        return self.database_url

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "Settings":
        env = EnvReader(os.environ if environ is None else environ)
        lease = env.number("LEASE_SECONDS", 30.0)
        values = dict(
            database_url=env.text("DATABASE_URL", None),
            db_schema=env.text("DB_SCHEMA", "skiplock"),
            tasks=env.names("TASKS", ()),
            queues=env.names("QUEUES", ("default",)),
            concurrency=env.integer("CONCURRENCY", 10),
            lease_seconds=lease,
            heartbeat_seconds=env.number("HEARTBEAT_SECONDS", lease / 3),
            shutdown_grace_seconds=env.number("SHUTDOWN_GRACE_SECONDS", min(25.0, lease * 5 / 6)),
            poll_seconds=env.number("POLL_SECONDS", 1.0),
            reaper_seconds=env.number("REAPER_SECONDS", 5.0),
            max_reclaims=env.integer("MAX_RECLAIMS", 10),
            max_payload_bytes=env.integer("MAX_PAYLOAD_BYTES", 1024 * 1024),
            claim_batch=env.integer("CLAIM_BATCH", 0),
            stuck_grace_seconds=env.number("STUCK_GRACE_SECONDS", 10.0),
            metrics_port=env.integer("METRICS_PORT", 9090),
            dev_api_port=env.integer("DEV_API_PORT", 8080),
            schedules_file=env.text("SCHEDULES_FILE", None),
            schedules_prune=env.boolean("SCHEDULES_PRUNE", False),
            gauges_seconds=env.number("GAUGES_SECONDS", 15.0),
            retention_seconds=env.number("RETENTION_SECONDS", 60.0),
            retain_completed_seconds=env.number("RETAIN_COMPLETED_SECONDS", 86400.0),
            retain_failed_seconds=env.number("RETAIN_FAILED_SECONDS", 7 * 86400.0),
            retain_cancelled_seconds=env.number("RETAIN_CANCELLED_SECONDS", 7 * 86400.0),
            retain_audit_seconds=env.number("RETAIN_AUDIT_SECONDS", 90 * 86400.0),
            webhook_allowed_networks=env.names("WEBHOOK_ALLOWED_NETWORKS", ()),
            webhook_allowed_ports=_ports(env.text("WEBHOOK_ALLOWED_PORTS", None)),
            webhook_concurrency=env.integer("WEBHOOK_CONCURRENCY", 16),
            webhook_lease_seconds=env.number("WEBHOOK_LEASE_SECONDS", 30.0),
            webhook_timeout_seconds=env.number("WEBHOOK_TIMEOUT_SECONDS", 10.0),
            webhook_max_attempts=env.integer("WEBHOOK_MAX_ATTEMPTS", 8),
            webhook_retry_base_seconds=env.number("WEBHOOK_RETRY_BASE_SECONDS", 1.0),
            webhook_retry_cap_seconds=env.number("WEBHOOK_RETRY_CAP_SECONDS", 900.0),
            api_tokens=parse_api_tokens(env.text("API_TOKENS", "")),
            api_auth=env.text("API_AUTH", "enabled").lower(),
            api_trusted_proxies=env.names("API_TRUSTED_PROXIES", ()),
            api_statement_timeout_seconds=env.number("API_STATEMENT_TIMEOUT_SECONDS", 5.0),
            log_format=env.text("LOG_FORMAT", "json").lower(),
            log_level=env.text("LOG_LEVEL", "INFO").upper(),
            pod_deletion_cost=env.boolean("POD_DELETION_COST", False),
            pod_name=env.text("POD_NAME", None),
            pod_namespace=env.text("POD_NAMESPACE", None),
            pod_deletion_cost_seconds=env.number("POD_DELETION_COST_SECONDS", 5.0),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class ApiToken(NamedTuple):
    """One API credential: who (named in the audit log), what it may do, and the SHA-256 of the
    bearer token (hex). The token itself is never configured or stored."""

    name: str
    role: str
    sha256: str


def parse_api_tokens(text: str, variable: str = "SKIPLOCK_API_TOKENS") -> tuple[ApiToken, ...]:
    """`name:role:sha256hex` entries separated by commas or newlines; `#` starts a comment.
    Messages name the entry, never echo its third field (someone may have pasted a raw token)."""
    tokens: list[ApiToken] = []
    entries = [part.strip() for line in text.splitlines() for part in line.split("#", 1)[0].split(",")]
    for number, entry in enumerate(filter(None, entries), 1):
        fields = [f.strip() for f in entry.rsplit(":", 2)]
        if len(fields) != 3:
            raise ConfigError(f"{variable}: entry {number} is not name:role:sha256-of-token")
        name, role, digest = fields
        if not NAME_RE.fullmatch(name):
            raise ConfigError(f"{variable}: entry {number}: invalid token name {name!r}: use 1-64 letters, "
                              "digits, '_', '.', ':' or '-'")
        if role not in API_ROLES:
            raise ConfigError(f"{variable}: entry {number} ({name}): role {role!r} must be one of "
                              f"{', '.join(API_ROLES)}")
        if not _SHA256_HEX.fullmatch(digest.lower()):
            raise ConfigError(f"{variable}: entry {number} ({name}): the third field must be the SHA-256 "
                              "of the token as 64 hex digits (e.g. `printf %s TOKEN | sha256sum`)")
        if any(t.name == name for t in tokens):
            raise ConfigError(f"{variable}: token name {name!r} is listed twice")
        tokens.append(ApiToken(name, role, digest.lower()))
    return tuple(tokens)


class EnvReader:
    """Typed reads of SKIPLOCK_* variables, with NAME_FILE support."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ

    def raw(self, name: str) -> str | None:
        key = PREFIX + name
        path = self.environ.get(key + "_FILE")
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    return fh.read().strip()
            except OSError as exc:
                raise ConfigError(f"{key}_FILE={path}: cannot read ({exc.strerror})") from exc
        value = self.environ.get(key)
        return None if value is None or value.strip() == "" else value.strip()

    def text(self, name: str, default):
        value = self.raw(name)
        return default if value is None else value

    def number(self, name: str, default: float) -> float:
        value = self.raw(name)
        if value is None:
            return default
        try:
            parsed = float(value)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={value!r}: not a number") from None
        if parsed != parsed or parsed in (float("inf"), float("-inf")):
            raise ConfigError(f"{PREFIX}{name}={value!r}: not a finite number")
        return parsed

    def integer(self, name: str, default: int) -> int:
        value = self.raw(name)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={value!r}: not an integer") from None

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{PREFIX}{name}={value!r}: must be true or false")

    def names(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return default
        return tuple(part.strip() for part in value.split(",") if part.strip())

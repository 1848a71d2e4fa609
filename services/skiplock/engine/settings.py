"""Settings: every knob comes from SKIPLOCK_* environment variables, parsed once into a frozen
dataclass and validated when built. A bad value fails at startup with the variable's name.

`NAME_FILE` may hold the path of a file whose content is the value (Kubernetes secrets).
This module reads the environment only when `Settings.from_env()` is called.

VARIABLES, at the end, declares every variable once: its default, which from_env() reads, and its
meaning, from which scripts/gen_docs.py writes the configuration tables of the docs.
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
# SKIPLOCK_DATABASE_POOLER: what the roles' connections go through (engine/store/connection.py
# pooler_options says what a transaction pooler rules out)
POOLERS = ("none", "session", "transaction")
# API roles, weakest first: each can do what the ones before it can
API_ROLES = ("reader", "submitter", "admin")
# gunicorn's worker timeout in `skiplock api` (api/server.py), and the longest long-poll allowed
# under it, with room to write the answer
API_WORKER_TIMEOUT_SECONDS = 60
API_MAX_WAIT_CEILING = 50.0
CLAIM_LANES_MAX = 1000
# the console's session-signing key: a secret an attacker cannot guess (`openssl rand -base64 32`)
CONSOLE_SESSION_KEY_MIN_CHARS = 32
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# an EnvReader read given no default: the variable's declared one (VARIABLES, at the end)
_DECLARED = object()


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


def check_pooler(value: str) -> str:
    """SKIPLOCK_DATABASE_POOLER's value, or ConfigError."""
    if value not in POOLERS:
        raise ConfigError(f"SKIPLOCK_DATABASE_POOLER={value!r}: must be one of {', '.join(POOLERS)}")
    return value


@dataclasses.dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    database_pooler: str = "none"
    listen: bool = True
    listen_database_url: str | None = None
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
    claim_lanes: int = 0  # 0: no bound on the claims of one queue at once
    max_children_per_run: int = 10_000  # ctx.enqueue's bound (worker/task_context.py)
    stuck_grace_seconds: float = 10.0
    metrics_port: int = 9090
    dev_api_port: int = 8080  # `skiplock dev` serves the HTTP API here (0: any free port)
    schedules_file: str | None = None
    schedules_prune: bool = False
    limits_file: str | None = None
    limits_prune: bool = False
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
    read_database_url: str | None = None  # the API's replica for its read-only routes (api/replica.py)
    read_max_lag_seconds: float = 30.0
    api_header_timeout_seconds: float = 10.0
    api_body_timeout_seconds: float = 60.0
    api_max_connections: int = 100
    api_submit_rate: float = 0.0
    api_submit_burst: int = 10
    api_submit_concurrency: int = 0
    api_large_body_bytes: int = 1024 * 1024
    # queues and kinds that non-admin submissions may bring into existence (api/names.py); 0: no limit
    api_max_queues: int = 1000
    api_max_kinds: int = 1000
    api_large_bodies: int = 1
    api_max_wait_seconds: float = 20.0  # GET /v1/tasks/{id}?wait= waits at most this long (api/tasks.py)
    api_max_waits: int = 2  # such waits one gunicorn worker holds at once
    # signs the console's cookies (api/console/session.py); None: the console is disabled
    console_session_key: str | None = dataclasses.field(default=None, repr=False)
    log_format: str = "json"
    log_level: str = "INFO"
    pod_deletion_cost: bool = False
    pod_name: str | None = None
    pod_namespace: str | None = None
    pod_deletion_cost_seconds: float = 5.0

    def __post_init__(self) -> None:
        from .store.conninfo import check_database_url  # the store imports this module

        for variable, url in (("SKIPLOCK_DATABASE_URL", self.database_url),
                              ("SKIPLOCK_LISTEN_DATABASE_URL", self.listen_database_url),
                              ("SKIPLOCK_READ_DATABASE_URL", self.read_database_url)):
            check_database_url(variable, url)
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
        if not 0 <= self.claim_lanes <= CLAIM_LANES_MAX:
            raise ConfigError(f"SKIPLOCK_CLAIM_LANES={self.claim_lanes}: must be 0-{CLAIM_LANES_MAX} "
                              "(0: no bound)")
        if self.max_children_per_run < 1:
            raise ConfigError(f"SKIPLOCK_MAX_CHILDREN_PER_RUN={self.max_children_per_run}: must be >= 1")
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
        if self.read_max_lag_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_READ_MAX_LAG_SECONDS={self.read_max_lag_seconds:g}: must be > 0")
        if self.api_statement_timeout_seconds <= 0:
            raise ConfigError(f"SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS={self.api_statement_timeout_seconds:g}: "
                              "must be > 0")
        for variable, value in (("API_HEADER_TIMEOUT_SECONDS", self.api_header_timeout_seconds),
                                ("API_BODY_TIMEOUT_SECONDS", self.api_body_timeout_seconds)):
            if value <= 0:
                raise ConfigError(f"SKIPLOCK_{variable}={value:g}: must be > 0")
        for variable, value in (("API_MAX_CONNECTIONS", self.api_max_connections),
                                ("API_SUBMIT_BURST", self.api_submit_burst),
                                ("API_LARGE_BODIES", self.api_large_bodies)):
            if value < 1:
                raise ConfigError(f"SKIPLOCK_{variable}={value}: must be a positive integer")
        if not 0 <= self.api_max_wait_seconds <= API_MAX_WAIT_CEILING:
            raise ConfigError(f"SKIPLOCK_API_MAX_WAIT_SECONDS={self.api_max_wait_seconds:g}: must be 0-"
                              f"{API_MAX_WAIT_CEILING:g} (below the API's worker timeout, "
                              f"{API_WORKER_TIMEOUT_SECONDS} s)")
        if self.api_max_waits < 0:
            raise ConfigError(f"SKIPLOCK_API_MAX_WAITS={self.api_max_waits}: must be >= 0 (0: no long-poll)")
        for variable, value in (("API_SUBMIT_RATE", self.api_submit_rate),
                                ("API_SUBMIT_CONCURRENCY", self.api_submit_concurrency),
                                ("API_LARGE_BODY_BYTES", self.api_large_body_bytes),
                                ("API_MAX_QUEUES", self.api_max_queues), ("API_MAX_KINDS", self.api_max_kinds)):
            if value < 0:
                raise ConfigError(f"SKIPLOCK_{variable}={value:g}: must be >= 0 (0: no limit)")
        if self.console_session_key is not None and len(self.console_session_key) < CONSOLE_SESSION_KEY_MIN_CHARS:
            raise ConfigError(f"SKIPLOCK_CONSOLE_SESSION_KEY: {len(self.console_session_key)} characters; use at "
                              f"least {CONSOLE_SESSION_KEY_MIN_CHARS} random ones (e.g. `openssl rand -base64 32`)")
        check_pooler(self.database_pooler)
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
        lease = env.number("LEASE_SECONDS")
        values = dict(
            database_url=env.text("DATABASE_URL"),
            database_pooler=env.text("DATABASE_POOLER").lower(),
            listen=env.boolean("LISTEN"),
            listen_database_url=env.text("LISTEN_DATABASE_URL"),
            db_schema=env.text("DB_SCHEMA"),
            tasks=env.names("TASKS"),
            queues=env.names("QUEUES"),
            concurrency=env.integer("CONCURRENCY"),
            lease_seconds=lease,
            heartbeat_seconds=env.number("HEARTBEAT_SECONDS", lease / 3),
            shutdown_grace_seconds=env.number("SHUTDOWN_GRACE_SECONDS", min(25.0, lease * 5 / 6)),
            poll_seconds=env.number("POLL_SECONDS"),
            reaper_seconds=env.number("REAPER_SECONDS"),
            max_reclaims=env.integer("MAX_RECLAIMS"),
            max_payload_bytes=env.integer("MAX_PAYLOAD_BYTES"),
            claim_batch=env.integer("CLAIM_BATCH"),
            claim_lanes=env.integer("CLAIM_LANES"),
            max_children_per_run=env.integer("MAX_CHILDREN_PER_RUN"),
            stuck_grace_seconds=env.number("STUCK_GRACE_SECONDS"),
            metrics_port=env.integer("METRICS_PORT"),
            dev_api_port=env.integer("DEV_API_PORT"),
            schedules_file=env.text("SCHEDULES_FILE"),
            schedules_prune=env.boolean("SCHEDULES_PRUNE"),
            limits_file=env.text("LIMITS_FILE"),
            limits_prune=env.boolean("LIMITS_PRUNE"),
            gauges_seconds=env.number("GAUGES_SECONDS"),
            retention_seconds=env.number("RETENTION_SECONDS"),
            retain_completed_seconds=env.number("RETAIN_COMPLETED_SECONDS"),
            retain_failed_seconds=env.number("RETAIN_FAILED_SECONDS"),
            retain_cancelled_seconds=env.number("RETAIN_CANCELLED_SECONDS"),
            retain_audit_seconds=env.number("RETAIN_AUDIT_SECONDS"),
            webhook_allowed_networks=env.names("WEBHOOK_ALLOWED_NETWORKS"),
            webhook_allowed_ports=_ports(env.text("WEBHOOK_ALLOWED_PORTS")),
            webhook_concurrency=env.integer("WEBHOOK_CONCURRENCY"),
            webhook_lease_seconds=env.number("WEBHOOK_LEASE_SECONDS"),
            webhook_timeout_seconds=env.number("WEBHOOK_TIMEOUT_SECONDS"),
            webhook_max_attempts=env.integer("WEBHOOK_MAX_ATTEMPTS"),
            webhook_retry_base_seconds=env.number("WEBHOOK_RETRY_BASE_SECONDS"),
            webhook_retry_cap_seconds=env.number("WEBHOOK_RETRY_CAP_SECONDS"),
            api_tokens=parse_api_tokens(env.text("API_TOKENS")),
            api_auth=env.text("API_AUTH").lower(),
            api_trusted_proxies=env.names("API_TRUSTED_PROXIES"),
            api_statement_timeout_seconds=env.number("API_STATEMENT_TIMEOUT_SECONDS"),
            read_database_url=env.text("READ_DATABASE_URL"),
            read_max_lag_seconds=env.number("READ_MAX_LAG_SECONDS"),
            api_header_timeout_seconds=env.number("API_HEADER_TIMEOUT_SECONDS"),
            api_body_timeout_seconds=env.number("API_BODY_TIMEOUT_SECONDS"),
            api_max_connections=env.integer("API_MAX_CONNECTIONS"),
            api_submit_rate=env.number("API_SUBMIT_RATE"),
            api_submit_burst=env.integer("API_SUBMIT_BURST"),
            api_submit_concurrency=env.integer("API_SUBMIT_CONCURRENCY"),
            api_large_body_bytes=env.integer("API_LARGE_BODY_BYTES"),
            api_max_queues=env.integer("API_MAX_QUEUES"),
            api_max_kinds=env.integer("API_MAX_KINDS"),
            api_large_bodies=env.integer("API_LARGE_BODIES"),
            api_max_wait_seconds=env.number("API_MAX_WAIT_SECONDS"),
            api_max_waits=env.integer("API_MAX_WAITS"),
            console_session_key=env.text("CONSOLE_SESSION_KEY"),
            log_format=env.text("LOG_FORMAT").lower(),
            log_level=env.text("LOG_LEVEL").upper(),
            pod_deletion_cost=env.boolean("POD_DELETION_COST"),
            pod_name=env.text("POD_NAME"),
            pod_namespace=env.text("POD_NAMESPACE"),
            pod_deletion_cost_seconds=env.number("POD_DELETION_COST_SECONDS"),
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
    """Typed reads of SKIPLOCK_* variables, with NAME_FILE support. A read without a default takes
    the one VARIABLES declares."""

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

    def text(self, name: str, default=_DECLARED):
        value = self.raw(name)
        return declared_default(name, default) if value is None else value

    def number(self, name: str, default: float = _DECLARED) -> float:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        try:
            parsed = float(value)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={value!r}: not a number") from None
        if parsed != parsed or parsed in (float("inf"), float("-inf")):
            raise ConfigError(f"{PREFIX}{name}={value!r}: not a finite number")
        return parsed

    def integer(self, name: str, default: int = _DECLARED) -> int:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={value!r}: not an integer") from None

    def boolean(self, name: str, default: bool = _DECLARED) -> bool:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{PREFIX}{name}={value!r}: must be true or false")

    def names(self, name: str, default: tuple[str, ...] = _DECLARED) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        return tuple(part.strip() for part in value.split(",") if part.strip())


# ---- every variable, declared once ----------------------------------------------------------------

class Variable(NamedTuple):
    """One SKIPLOCK_* variable: the default from_env() reads when it is unset, and what the docs'
    configuration tables say about it (scripts/gen_docs.py writes them from VARIABLES)."""

    name: str                 # without the SKIPLOCK_ prefix
    default: object           # when unset; the two defaults that depend on the lease are computed
    meaning: str              # one line of Markdown
    group: str                # its heading in docs/CONFIGURATION.md
    shown: str | None = None  # the default as the tables show it, where the value does not say it
    more: str = ""            # what docs/CONFIGURATION.md adds to the meaning
    contract: bool = False    # listed in docs/CONTRACT.md too
    readme: bool = False      # listed in the README too
    parsed: bool = True       # read by Settings.from_env(); False: read where it is used


_ANY = "Every role"
_WORKER = "Worker"
_SCHEDULER = "Scheduler"
_DISPATCHER = "Dispatcher (webhooks)"
_API = "API"
_POD = "Worker pods on Kubernetes"
_DEV = "Development"
GROUPS = (_ANY, _WORKER, _SCHEDULER, _DISPATCHER, _API, _POD, _DEV)  # docs/CONFIGURATION.md's order

VARIABLES: tuple[Variable, ...] = (
    # the contract's variables first, in docs/CONTRACT.md's order
    Variable("DATABASE_URL", None, "libpq URL", _ANY, shown="— (required outside `dev`)",
             contract=True, readme=True),
    Variable("DATABASE_POOLER", "none", "what the URL reaches: `none` (Postgres), `session` (a pooler in session "
             "mode) or `transaction` (a pooler in transaction mode: no prepared statements, no session settings, "
             "so no generic plans for the worker's claims and no per-session statement timeout)", _ANY,
             more="a worker behind a transaction pooler needs `SKIPLOCK_LISTEN=false` or "
             "`SKIPLOCK_LISTEN_DATABASE_URL`; docs/OPERATIONS.md says what it costs", contract=True),
    Variable("LISTEN", True, "a worker holds a LISTEN connection and claims as soon as work is notified; `false`: "
             "it only polls, every `SKIPLOCK_POLL_SECONDS`", _WORKER, contract=True),
    Variable("LISTEN_DATABASE_URL", None, "libpq URL of the worker's LISTEN connection, where it differs from "
             "`SKIPLOCK_DATABASE_URL` (a direct one, when that URL is a transaction pooler's)", _WORKER,
             shown="`SKIPLOCK_DATABASE_URL`", contract=True),
    Variable("TASKS", (), "comma-separated modules that define task handlers; imported by the worker (and "
             "by the API, which then validates typed payloads), the current directory searched first", _WORKER, more="`--tasks` overrides it", contract=True,
             readme=True),
    Variable("QUEUES", ("default",), "queues a worker claims from", _WORKER,
             more="comma-separated; `--queues` overrides it", contract=True, readme=True),
    Variable("CONCURRENCY", 10, "tasks one worker process runs at once", _WORKER,
             more="handler threads; `async def` handlers share one event loop; `--concurrency` overrides it",
             contract=True, readme=True),
    Variable("LEASE_SECONDS", 30.0, "lease granted by a claim or a heartbeat", _WORKER, contract=True,
             readme=True),
    Variable("HEARTBEAT_SECONDS", None, "must be ≤ lease / 3 or startup fails", _WORKER, shown="lease / 3",
             more="how often a worker renews every claim it holds, in one statement", contract=True),
    Variable("SHUTDOWN_GRACE_SECONDS", 25.0, "drain time after SIGTERM; must be < lease", _ANY, shown="`25`",
             more="when the lease is under 30 s the default is 5/6 of it; the API's gunicorn graceful timeout",
             contract=True),
    Variable("POLL_SECONDS", 1.0, "poll interval when no notification arrives", _WORKER,
             more="also how soon the scheduler sees that a `buffer_one` schedule's previous task ended",
             contract=True),
    Variable("REAPER_SECONDS", 5.0, "how often expired leases are reclaimed", _WORKER,
             more="by every scheduler and, as a fallback, every worker", contract=True),
    Variable("METRICS_PORT", 9090, "Prometheus endpoint of a role (`/metrics`), also `/healthz`, `/readyz`", _ANY,
             more="`0`: any free port", contract=True, readme=True),
    Variable("API_TOKENS", "", "API credentials (see API)", _API, shown="—",
             more="`name:role:sha256-of-token` entries, comma or newline separated; `_FILE` for a secret",
             contract=True),
    Variable("POD_DELETION_COST", False, "a worker in a pod keeps its pod's "
             "`controller.kubernetes.io/pod-deletion-cost` annotation near its in-flight count, so scale-in removes idle workers first (needs "
             "`skiplock[kubernetes]` and RBAC to patch its pod; `KUBECONFIG` replaces the in-cluster configuration "
             "when set)", _POD, contract=True),
    Variable("POD_NAME", None, "the worker's own pod's name, from the downward API", _POD,
             shown="— (required when `SKIPLOCK_POD_DELETION_COST` is true)", contract=True),
    Variable("POD_NAMESPACE", None, "the worker's own pod's namespace, from the downward API", _POD,
             shown="— (required when `SKIPLOCK_POD_DELETION_COST` is true)", contract=True),
    Variable("POD_DELETION_COST_SECONDS", 5.0, "the least time between two patches of that annotation; a patch is "
             "sent only when the value changed", _POD, contract=True),
    Variable("LOG_FORMAT", "json", "logs to stdout: `json` or `text`", _ANY, contract=True),
    Variable("LOG_LEVEL", "INFO", "logs to stdout: the least level written", _ANY, contract=True),
    Variable("MIGRATIONS_DIR", None, "where `skiplock migrate` reads its files (an override; the wheel and the "
             "image carry them)", _ANY, shown="the package's own `skiplock/migrations`", contract=True,
             parsed=False),
    Variable("DB_SCHEMA", "skiplock", "schema of every table", _ANY),
    Variable("MAX_PAYLOAD_BYTES", 1024 * 1024, "larger payloads are refused at enqueue", _ANY,
             more="by `skiplock.enqueue`, `enqueue_many` and the API (413)"),
    Variable("MAX_RECLAIMS", 10, "lease expiries before a task is failed", _WORKER),
    Variable("CLAIM_BATCH", 0, "most tasks one claim takes; 0: as many as there are free slots", _WORKER),
    Variable("CLAIM_LANES", 0, "most claims of one queue that run at once, across every worker (0: no bound); "
             "a worker that finds them all taken looks again after a pause of about 0.1 s, doubling to 1 s",
             _WORKER, more="many worker processes on one queue and a database short of CPU: about its CPU count "
                           "(docs/SCALING.md, many worker processes on one queue)", contract=True),
    Variable("MAX_CHILDREN_PER_RUN", 10_000, "most tasks one run of a handler may enqueue (`ctx.enqueue`, "
             "`ctx.enqueue_many`); one more fails the task at once and none of its children is kept", _WORKER,
             more="they commit with the run's outcome in one transaction, which grows with them: a larger "
                  "fan-out goes through steps or through children that enqueue the next part", contract=True),
    Variable("STUCK_GRACE_SECONDS", 10.0, "after a kind's `timeout`, how long a handler that ignores "
             "`ctx.cancel_requested` may keep its thread before it is abandoned (and the task retried)", _WORKER),
    Variable("SCHEDULES_FILE", None, "a schedules YAML file applied at start-up (a mounted ConfigMap)", _SCHEDULER),
    Variable("SCHEDULES_PRUNE", False, "with the file, also delete schedules it does not name", _SCHEDULER),
    Variable("LIMITS_FILE", None, "a limits YAML file applied at start-up (a mounted ConfigMap; "
             "`skiplock limits apply -f` takes the same file)", _SCHEDULER, contract=True),
    Variable("LIMITS_PRUNE", False, "with the file, also delete the limits of kinds it does not name", _SCHEDULER,
             contract=True),
    Variable("GAUGES_SECONDS", 15.0, "how often the queue gauges are recomputed", _SCHEDULER),
    Variable("RETENTION_SECONDS", 60.0, "how often retention runs", _SCHEDULER),
    Variable("RETAIN_COMPLETED_SECONDS", 86400.0, "completed tasks (and their events) are deleted this long after "
             "finishing; `0` keeps them", _SCHEDULER),
    Variable("RETAIN_FAILED_SECONDS", 7 * 86400.0, "the same for failed tasks", _SCHEDULER),
    Variable("RETAIN_CANCELLED_SECONDS", 7 * 86400.0, "the same for cancelled tasks", _SCHEDULER),
    Variable("RETAIN_AUDIT_SECONDS", 90 * 86400.0, "audit log rows are deleted this long after they were written; "
             "`0` keeps them", _SCHEDULER, shown="`7776000` (90 days)", contract=True),
    Variable("WEBHOOK_ALLOWED_NETWORKS", (), "CIDRs deliveries may reach besides public addresses", _DISPATCHER,
             more="checked when an endpoint is added and at every attempt; `skiplock dev`: 127.0.0.0/8"),
    Variable("WEBHOOK_ALLOWED_PORTS", None, "ports deliveries may reach: comma-separated ports and ranges "
             "(`80,443,8000-8999`)", _DISPATCHER,
             shown="80, 443 and 1024-65535 except engine/webhooks.py `DENIED_PORTS`",
             more="the default leaves out the ports of databases, caches, queues and control planes "
             "(1433, 1521, 2375-2376, 2379-2380, 3306, 5432, 5672, 5984, 6379, 6443, 8200, 8500, 9200, 9300, "
             "10250, 10255, 11211, 27017); a list that is set is taken as it is", contract=True),
    Variable("WEBHOOK_CONCURRENCY", 16, "requests in flight per dispatcher", _DISPATCHER),
    Variable("WEBHOOK_LEASE_SECONDS", 30.0, "lease of a claimed delivery; must exceed the timeout and the "
             "shutdown grace", _DISPATCHER),
    Variable("WEBHOOK_TIMEOUT_SECONDS", 10.0, "total time of one attempt (connect ≤ 5 s)", _DISPATCHER),
    Variable("WEBHOOK_MAX_ATTEMPTS", 8, "attempts before the dead letter", _DISPATCHER),
    Variable("WEBHOOK_RETRY_BASE_SECONDS", 1.0, "backoff base: attempt n waits `uniform(0, min(cap, base·2^(n-1)))`",
             _DISPATCHER),
    Variable("WEBHOOK_RETRY_CAP_SECONDS", 900.0, "backoff cap", _DISPATCHER),
    Variable("API_TRUSTED_PROXIES", (), "CIDRs of the proxies in front of the API whose `X-Forwarded-For` names "
             "the client in refusal logs", _API, shown="— (none: the peer's address)", contract=True),
    Variable("API_STATEMENT_TIMEOUT_SECONDS", 5.0, "the longest an API read may run in Postgres; one that takes "
             "longer answers 503 `database.statement_timeout`", _API, contract=True),
    Variable("READ_DATABASE_URL", None, "libpq URL of a read replica (a streaming standby) for the API's and the "
             "console's read-only routes; writes, and reads that must see the caller's own writes, stay on "
             "`SKIPLOCK_DATABASE_URL`. Unset: every read on the primary", _API, shown="— (every read on the primary)",
             more="while the replica does not answer, or lags more than `SKIPLOCK_READ_MAX_LAG_SECONDS`, those reads "
             "go to the primary; docs/SCALING.md lists the routes", contract=True),
    Variable("READ_MAX_LAG_SECONDS", 30.0, "while the replica is further behind the primary than this, the reads "
             "it would serve go to the primary", _API, contract=True),
    Variable("API_HEADER_TIMEOUT_SECONDS", 10.0, "the longest a client may take to send a request's line and "
             "headers; then the connection is closed", _API, contract=True),
    Variable("API_BODY_TIMEOUT_SECONDS", 60.0, "the longest a client may take to send a request's body (and to "
             "read its response); then 408 `request.timeout`", _API, contract=True),
    Variable("API_MAX_CONNECTIONS", 100, "open connections one gunicorn worker holds; beyond it new ones wait in "
             "the listen backlog", _API, contract=True),
    Variable("API_SUBMIT_RATE", 0.0, "submissions (`POST /v1/tasks`, `POST /v1/tasks:batch`) per second one token "
             "may make, per gunicorn worker; over it 429 `request.rate_limited` with `Retry-After`; `0`: no limit",
             _API, contract=True),
    Variable("API_SUBMIT_BURST", 10, "submissions a token may make at once above its rate, per worker", _API,
             contract=True),
    Variable("API_SUBMIT_CONCURRENCY", 0, "submissions one token may have in flight, per gunicorn worker; over it "
             "429 with `Retry-After`; `0`: no limit", _API, contract=True),
    Variable("API_LARGE_BODY_BYTES", 1024 * 1024, "a request body above this size (or without a length, on a route "
             "that allows more) is large", _API, contract=True),
    Variable("API_MAX_QUEUES", 1000, "queues that exist (ever had a task) past which a non-admin `POST /v1/tasks` or "
             "`:batch` naming a new queue answers 409 `task.name_limit`; names that exist, admins and the library are "
             "not refused; `0`: no limit", _API, contract=True),
    Variable("API_MAX_KINDS", 1000, "the same bound for kinds", _API, contract=True),
    Variable("API_LARGE_BODIES", 1, "large bodies one gunicorn worker reads and parses at once; another answers "
             "429 with `Retry-After` (this bounds the API's memory)", _API, contract=True),
    Variable("API_MAX_WAIT_SECONDS", 20.0, "the longest `GET /v1/tasks/{id}?wait=` holds a request for a task to "
             "end (a longer `wait` is cut to it; also to the shutdown grace); `0`: no long-poll", _API,
             more=f"at most {API_MAX_WAIT_CEILING:g}, below gunicorn's worker timeout", contract=True),
    Variable("API_MAX_WAITS", 2, "long-polls one gunicorn worker holds at once (each holds a request thread and a "
             "database connection; at most `--threads` − 1 of them); another answers 429 with `Retry-After`; "
             "`0`: no long-poll", _API, contract=True),
    Variable("CONSOLE_SESSION_KEY", None, "the secret that signs the web console's session cookies: at least "
             f"{CONSOLE_SESSION_KEY_MIN_CHARS} random characters, `_FILE` for a secret; changing it ends every "
             "session. Unset: the console is disabled (its pages answer 503 `console.disabled`), the API serves",
             _API, shown="— (console disabled)", more="every API process must have the same one; with "
             "`SKIPLOCK_API_AUTH=disabled` (and in `skiplock dev`) a run makes one of its own", contract=True),
    Variable("API_AUTH", "enabled", "`disabled` serves everyone as admin without a token (development only; logs "
             "a warning)", _API),
    Variable("DEV_API_PORT", 8080, "`skiplock dev` only: port of the HTTP API it serves on 127.0.0.1 without auth "
             "(`0`: any free port)", _DEV),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def declared_default(name: str, default=_DECLARED):
    """`default` if given, else the one VARIABLES declares for SKIPLOCK_<name>."""
    if default is not _DECLARED:
        return default
    try:
        return _BY_NAME[name].default
    except KeyError:
        raise LookupError(f"{PREFIX}{name} is read with no default and not declared in VARIABLES") from None

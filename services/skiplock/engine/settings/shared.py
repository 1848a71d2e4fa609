"""The variables more than one role reads: the database every role connects to (its URL, its
pooler, its schema), logs, the metrics port, the shutdown grace, the payload limit; and the name
rules the API, the CLI and the store share. `DATABASE` configs (engine/settings/__init__.py) hold
the first three; a role's config holds them too.

It declares; it reads no environment.
"""

from __future__ import annotations

import re

from ..errors import ConfigError, InvalidInput
from .declaration import ANY, EVERY_ROLE, Bound, Variable, port

# Validation patterns are applied with fullmatch: `$` alone admits a trailing newline ("q1\n").
# NAME_RE keeps its anchors because the API publishes it as a JSON Schema pattern.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# SKIPLOCK_DATABASE_POOLER: what the roles' connections go through (engine/store/connection.py
# pooler_options says what a transaction pooler rules out)
POOLERS = ("none", "session", "transaction")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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


def _schema(variable: Variable, value) -> None:
    if not SCHEMA_RE.fullmatch(value):
        raise ConfigError(f"{variable.env}: invalid schema name {value!r}")


def _log_level(variable: Variable, value) -> None:
    if value.upper() not in LOG_LEVELS:
        raise ConfigError(f"{variable.env}={value!r}: must be a logging level")


def check_url(variable: Variable, value) -> None:
    """A libpq URL that libpq parses, or ConfigError naming the variable and never its value (it may
    hold the password)."""
    from ..store.conninfo import check_database_url  # the store imports this package

    check_database_url(variable.env, value)


def _lower(value):
    return value.lower()


# every role's config holds the database's variables
DATABASE = ("database",)

VARIABLES: tuple[Variable, ...] = (
    Variable("DATABASE_URL", None, "libpq URL", ANY, DATABASE, checker=check_url, shown="— (required outside `dev`)",
             contract=1, readme=1),
    Variable("DATABASE_POOLER", "none", "what the URL reaches: `none` (Postgres), `session` (a pooler in session "
             "mode) or `transaction` (a pooler in transaction mode: no prepared statements, no session settings, "
             "so no generic plans for the worker's claims and no per-session statement timeout)", ANY, DATABASE,
             type="str", convert=_lower, choices=POOLERS, says=f"one of {', '.join(POOLERS)}",
             more="a worker behind a transaction pooler needs `SKIPLOCK_LISTEN=false` or "
             "`SKIPLOCK_LISTEN_DATABASE_URL`; docs/OPERATIONS.md says what it costs", contract=2),
    Variable("SHUTDOWN_GRACE_SECONDS", 25.0, "drain time after SIGTERM; must be < lease", ANY,
             ("worker", "dispatcher", "api", "dev"), kind="number", shown="`25`",
             derive=lambda values: min(25.0, values["lease_seconds"] * 5 / 6),
             more="when the lease is under 30 s the default is 5/6 of it; the API's gunicorn graceful timeout",
             contract=10),
    Variable("METRICS_PORT", 9090, "Prometheus endpoint of a role (`/metrics`), also `/healthz`, `/readyz`", ANY,
             EVERY_ROLE, kind="integer", bound=port(), more="`0`: any free port", contract=13, readme=6),
    Variable("LOG_FORMAT", "json", "logs to stdout: `json` or `text`", ANY, EVERY_ROLE, type="str",
             convert=_lower, choices=("json", "text"), says="json or text", contract=19),
    Variable("LOG_LEVEL", "INFO", "logs to stdout: the least level written", ANY, EVERY_ROLE, type="str",
             convert=str.upper, checker=_log_level, contract=20),
    Variable("MIGRATIONS_DIR", None, "where `skiplock migrate` reads its files (an override; the wheel and the "
             "image carry them)", ANY, shown="the package's own `skiplock/migrations`", contract=21,
             parsed=False),
    Variable("DB_SCHEMA", "skiplock", "schema of every table", ANY, DATABASE, type="str", checker=_schema),
    Variable("MAX_PAYLOAD_BYTES", 1024 * 1024, "larger payloads are refused at enqueue", ANY,
             ("scheduler", "api", "dev"), kind="integer", bound=Bound(1, ">= 1"),
             more="by `skiplock.enqueue`, `enqueue_many` and the API (413)"),
)


class DatabaseMethods:
    """What every config holding the database's variables answers besides them."""

    database_url: str | None
    db_schema: str

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel; one per schema so two installations never wake each other."""
        return f"skiplock_{self.db_schema}"

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigError("SKIPLOCK_DATABASE_URL: required (a libpq URL, e.g. postgresql://user@host/db)")
        return self.database_url

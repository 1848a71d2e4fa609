"""The API's variables (credentials, its read replica, timeouts and admission bounds, long-polls and feeds),
the parsing of its token list, and `skiplock dev`'s port.

It declares; it reads no environment.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import ConfigError
from .declaration import API, DEV, Bound, Variable, at_least_zero, port, positive
from .dispatcher import check_networks
from .shared import NAME_RE, check_url

# API roles, weakest first: each can do what the ones before it can
API_ROLES = ("reader", "submitter", "admin")
# gunicorn's worker timeout in `skiplock api` (api/server.py), and the longest long-poll allowed
# under it, with room to write the answer
API_WORKER_TIMEOUT_SECONDS = 60
API_MAX_WAIT_CEILING = 50.0
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# the console's session-signing key: a secret an attacker cannot guess (`openssl rand -base64 32`)
CONSOLE_SESSION_KEY_MIN_CHARS = 32


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


def _session_key(variable: Variable, value) -> None:
    if value is not None and len(value) < CONSOLE_SESSION_KEY_MIN_CHARS:
        raise ConfigError(f"{variable.env}: {len(value)} characters; use at least {CONSOLE_SESSION_KEY_MIN_CHARS} "
                          "random ones (e.g. `openssl rand -base64 32`)")


def _tokens(value) -> tuple[ApiToken, ...]:
    return value if isinstance(value, tuple) else parse_api_tokens(value)


_A = ("api", "dev")
_NO_BOUND = at_least_zero("(0: no limit)")

VARIABLES: tuple[Variable, ...] = (
    Variable("API_TOKENS", "", "API credentials (see API)", API, _A, type="tuple[ApiToken, ...]", convert=_tokens,
             shown="—", more="`name:role:sha256-of-token` entries, comma or newline separated; `_FILE` for a secret",
             contract=14),
    Variable("API_TRUSTED_PROXIES", (), "CIDRs of the proxies in front of the API whose `X-Forwarded-For` names "
             "the client in refusal logs", API, _A, kind="names", checker=check_networks,
             shown="— (none: the peer's address)", contract=28),
    Variable("API_STATEMENT_TIMEOUT_SECONDS", 5.0, "the longest an API read may run in Postgres; one that takes "
             "longer answers 503 `database.statement_timeout`", API, _A, kind="number", bound=positive(),
             contract=29),
    Variable("READ_DATABASE_URL", None, "libpq URL of a read replica (a streaming standby) for the API's and the "
             "console's read-only routes; writes, and reads that must see the caller's own writes, stay on "
             "`SKIPLOCK_DATABASE_URL`. Unset: every read on the primary", API, _A, checker=check_url, shown="— (every read on the primary)",
             more="while the replica does not answer, or lags more than `SKIPLOCK_READ_MAX_LAG_SECONDS`, those reads "
             "go to the primary; docs/SCALING.md lists the routes", contract=30),
    Variable("READ_MAX_LAG_SECONDS", 30.0, "while the replica is further behind the primary than this, the reads "
             "it would serve go to the primary", API, _A, kind="number", bound=positive(), contract=31),
    Variable("API_HEADER_TIMEOUT_SECONDS", 10.0, "the longest a client may take to send a request's line and "
             "headers; then the connection is closed", API, _A, kind="number", bound=positive(), contract=32),
    Variable("API_BODY_TIMEOUT_SECONDS", 60.0, "the longest a client may take to send a request's body (and to "
             "read its response); then 408 `request.timeout`", API, _A, kind="number", bound=positive(), contract=33),
    Variable("API_MAX_CONNECTIONS", 100, "open connections one gunicorn worker holds; beyond it new ones wait in "
             "the listen backlog", API, _A, kind="integer", bound=positive("integer"), contract=34),
    Variable("API_SUBMIT_RATE", 0.0, "submissions (`POST /v1/tasks`, `POST /v1/tasks:batch`) per second one token "
             "may make, per gunicorn worker; over it 429 `request.rate_limited` with `Retry-After`; `0`: no limit",
             API, _A, kind="number", bound=_NO_BOUND, contract=35),
    Variable("API_SUBMIT_BURST", 10, "submissions a token may make at once above its rate, per worker", API, _A,
             kind="integer", bound=positive("integer"), contract=36),
    Variable("API_SUBMIT_CONCURRENCY", 0, "submissions one token may have in flight, per gunicorn worker; over it "
             "429 with `Retry-After`; `0`: no limit", API, _A, kind="integer", bound=_NO_BOUND, contract=37),
    Variable("API_LARGE_BODY_BYTES", 1024 * 1024, "a request body above this size (or without a length, on a route "
             "that allows more) is large", API, _A, kind="integer", bound=_NO_BOUND, contract=38),
    Variable("API_MAX_QUEUES", 1000, "queues that exist (ever had a task) past which a non-admin `POST /v1/tasks` or "
             "`:batch` naming a new queue answers 409 `task.name_limit`; names that exist, admins and the library are "
             "not refused; `0`: no limit", API, _A, kind="integer", bound=_NO_BOUND, contract=39),
    Variable("API_MAX_KINDS", 1000, "the same bound for kinds", API, _A, kind="integer", bound=_NO_BOUND, contract=40),
    Variable("API_LARGE_BODIES", 1, "large bodies one gunicorn worker reads and parses at once; another answers "
             "429 with `Retry-After` (this bounds the API's memory)", API, _A, kind="integer",
             bound=positive("integer"), contract=41),
    Variable("API_MAX_WAIT_SECONDS", 20.0, "the longest `GET /v1/tasks/{id}?wait=` holds a request for a task to "
             "end (a longer `wait` is cut to it; also to the shutdown grace); `0`: no long-poll", API, _A,
             kind="number", bound=Bound(0, f"0-{API_MAX_WAIT_CEILING:g} (below the API's worker timeout, "
                                           f"{API_WORKER_TIMEOUT_SECONDS} s)", high=API_MAX_WAIT_CEILING),
             more=f"at most {API_MAX_WAIT_CEILING:g}, below gunicorn's worker timeout", contract=42),
    Variable("API_MAX_WAITS", 2, "long-polls one gunicorn worker holds at once (each holds a request thread and a "
             "database connection; at most `--threads` − 1 of them); another answers 429 with `Retry-After`; "
             "`0`: no long-poll", API, _A, kind="integer", bound=at_least_zero("(0: no long-poll)"), contract=43),
    Variable("API_MAX_FEEDS", 2, "event feeds one gunicorn worker holds at once: `GET /v1/events` long-polls and "
             "`GET /v1/events/stream` streams, the console's live pages among them (each holds a request thread); "
             "another answers 429 `request.rate_limited` with `Retry-After`; `0`: no stream, and no feed long-poll",
             API, _A, kind="integer", bound=at_least_zero("(0: no stream)"),
             more="feeds and `?wait=` long-polls together hold at most `--threads` − 1 threads of a worker, so "
             "one is always left for other requests", contract=48),
    Variable("API_MAX_AUTH_FAILURES", 10, "wrong tokens one client address may present (to the API or the "
             "console's sign-in) in a minute, counted across every API process; past it 429 `auth.throttled` with "
             "`Retry-After`, and that address's requests are refused until the minute ends; `0`: no limit", API, _A,
             kind="integer", bound=_NO_BOUND, contract=46),
    Variable("CONSOLE_SESSION_KEY", None, "the secret that signs the web console's session cookies: at least "
             f"{CONSOLE_SESSION_KEY_MIN_CHARS} random characters, `_FILE` for a secret; changing it ends every "
             "session. Unset: the console is disabled (its pages answer 503 `console.disabled`), the API serves",
             API, _A, checker=_session_key, secret=True, shown="— (console disabled)",
             more="every API process must have the same one; with `SKIPLOCK_API_AUTH=disabled` (and in "
             "`skiplock dev`) a run makes one of its own", contract=44),
    Variable("API_AUTH", "enabled", "`disabled` serves everyone as admin without a token (development only; logs "
             "a warning)", API, _A, type="str", convert=str.lower, choices=("enabled", "disabled"),
             says="enabled or disabled"),
    Variable("DEV_API_PORT", 8080, "`skiplock dev` only: port of the HTTP API it serves on 127.0.0.1 without auth "
             "(`0`: any free port)", DEV, ("dev",), kind="integer", bound=port()),
)

"""Bearer-token authentication and roles, fail-closed.

Tokens are configured as SHA-256 digests (SKIPLOCK_API_TOKENS); a presented token is hashed and
compared with every configured digest in constant time, so neither the comparison nor which
entry matched shows in the response time. Roles rank reader < submitter < admin.
Building an Authenticator with auth enabled and no token is a configuration error: the API
never serves open by accident. This module does not know routes; the app asks it per request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import NamedTuple

from ..engine.errors import ConfigError, Forbidden, Unauthorized
from ..engine.settings import API_ROLES, ApiToken

log = logging.getLogger("skiplock.api.auth")

# Longer "tokens" are refused before hashing: nobody issues them, and hashing is work.
MAX_TOKEN_LENGTH = 4096


class Principal(NamedTuple):
    name: str  # the audit log's actor
    role: str


ANONYMOUS = Principal("anonymous", "admin")


def rank(role: str) -> int:
    return API_ROLES.index(role)


class Authenticator:
    def __init__(self, tokens: tuple[ApiToken, ...], enabled: bool = True):
        if enabled and not tokens:
            raise ConfigError("SKIPLOCK_API_TOKENS: no API token configured, so the API refuses to start "
                              "(list name:role:sha256-of-token entries, or set SKIPLOCK_API_AUTH=disabled "
                              "for local development)")
        self.enabled = enabled
        self._tokens = [(t, bytes.fromhex(t.sha256)) for t in tokens]
        if not enabled:
            log.warning("SKIPLOCK_API_AUTH=disabled: every request is served as admin without a token; "
                        "never expose this API")

    def authenticate(self, header: str | None) -> Principal:
        """The principal an Authorization header proves, or Unauthorized."""
        if not self.enabled:
            return ANONYMOUS
        if not header:
            raise Unauthorized("authentication required: send Authorization: Bearer <token>")
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be `Bearer <token>`")
        if len(token) > MAX_TOKEN_LENGTH:
            raise Unauthorized("invalid token")
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for entry, expected in self._tokens:  # every entry, always: no early exit to time
            if hmac.compare_digest(digest, expected):
                found = entry
        if found is None:
            raise Unauthorized("invalid token")
        return Principal(found.name, found.role)

    @staticmethod
    def require(principal: Principal, role: str, what: str) -> None:
        if rank(principal.role) < rank(role):
            raise Forbidden(f"token {principal.name!r} has role {principal.role}; {what} needs {role}")

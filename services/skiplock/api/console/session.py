"""The console's session: a signed, expiring cookie that names the API token it was opened with
and carries the CSRF token of every form.

The signing key is derived from the configuration, so no default secret exists and nothing new
has to be configured: HMAC-SHA256 over every configured `name:role:sha256` token entry (with
authentication disabled, over the database URL; there is no login then, only the CSRF token).
Changing SKIPLOCK_API_TOKENS (adding, rotating or revoking a token) therefore ends every session.
The role is not stored: each request looks the session's token name up in the current
configuration, so a changed role applies at once and a removed name ends the session.

The cookie is HttpOnly and SameSite=Strict, Secure when the request came over HTTPS (directly,
or through a proxy that sends X-Forwarded-Proto: https). This module only reads and writes the
cookie; which page needs which role is the views' business.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import NamedTuple

from flask import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from ...engine.settings import ApiSettings
from ..auth import ANONYMOUS, Principal

COOKIE = "skiplock_console"
# A session lasts a working day; signing in again takes one paste of the token.
MAX_AGE_SECONDS = 8 * 3600


def cookie_options(request: Request) -> dict:
    """How the console's cookies are set: for the console's paths only, out of scripts' reach,
    never sent by another site, over HTTPS only when the request came that way."""
    secure = request.is_secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
    return dict(path=request.script_root + "/", httponly=True, samesite="Strict", secure=secure)


class Session(NamedTuple):
    csrf: str
    principal: Principal | None  # None: not signed in (the login form still needs its CSRF token)


def signing_key(settings: ApiSettings) -> bytes:
    if settings.api_tokens:
        material = "\n".join(f"{t.name}:{t.role}:{t.sha256}" for t in sorted(settings.api_tokens))
    else:
        material = settings.database_url or ""
    return hmac.new(b"skiplock console session v1", material.encode(), hashlib.sha256).digest()


class Sessions:
    def __init__(self, settings: ApiSettings, auth_enabled: bool):
        self._serializer = URLSafeTimedSerializer(signing_key(settings), salt="skiplock.console")
        self._roles = {t.name: t.role for t in settings.api_tokens}
        self.auth_enabled = auth_enabled

    def read(self, request: Request) -> Session | None:
        """The request's valid session, or None (absent, forged, expired or for a removed token)."""
        raw = request.cookies.get(COOKIE)
        if not raw:
            return None
        try:
            data = self._serializer.loads(raw, max_age=MAX_AGE_SECONDS)
        except BadSignature:  # also SignatureExpired
            return None
        if not isinstance(data, dict) or not isinstance(data.get("c"), str):
            return None
        if not self.auth_enabled:
            return Session(data["c"], ANONYMOUS)
        name = data.get("n")
        if name is None:
            return Session(data["c"], None)
        role = self._roles.get(name)
        return Session(data["c"], Principal(name, role)) if role is not None else None

    def new(self, principal: Principal | None) -> Session:
        """A new session (a fresh CSRF token, so signing in never keeps a token seen before)."""
        return Session(secrets.token_urlsafe(32), principal)

    def write(self, response: Response, request: Request, session: Session) -> None:
        data = {"c": session.csrf}
        if session.principal is not None and self.auth_enabled:
            data["n"] = session.principal.name
        response.set_cookie(COOKIE, self._serializer.dumps(data), max_age=MAX_AGE_SECONDS, **cookie_options(request))

    @staticmethod
    def csrf_ok(session: Session | None, supplied: str | None) -> bool:
        return session is not None and bool(supplied) and hmac.compare_digest(session.csrf, supplied)

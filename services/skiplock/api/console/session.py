"""The console's session: a signed, expiring cookie that names the API token it was opened with
and carries the CSRF token of every form.

The signing key is SKIPLOCK_CONSOLE_SESSION_KEY, a secret of its own and nothing else: the token
list is configuration anyone with read access to a ConfigMap or the chart's values may see, so
nothing derived from it may sign a session. Changing the key ends every session. Without a key
the console is disabled (`Sessions.key_missing`; views.py answers every page 503): there is no
fallback key, because any fallback would be a default secret or one derived from something public.
With authentication disabled there is no one to sign in as, and `with_run_key` makes a key of
the run's own (`skiplock api`, `skiplock dev`).
The role is not stored: each request looks the session's token name up in the current
configuration, so a changed role applies at once, and a removed name or a rotated token (the
cookie holds the start of the token's SHA-256) ends the session.

Sign-out ends a session on the server, not only in the browser that signs out: each signed-in
session carries a random id, and `end` records it (console_sessions_ended, kept 8 hours), so a
copy of the cookie kept after sign-out gets the sign-in page. A session also carries its token's
sign-out generation; `skiplock tokens sign-out NAME` ends every session of that token at once.
Each signed-in request looks both up in one statement (an indexed probe of each): a POST on the
primary, so that no change is ever made with a session signed out; a page on the read replica when
there is one and it may serve (api/replica.py), so a kept cookie may still read pages for as long as
the replica lags (at most SKIPLOCK_READ_MAX_LAG_SECONDS), never change anything.

The cookie is HttpOnly and SameSite=Lax, Secure when the request came over HTTPS (directly, or
through a proxy that sends X-Forwarded-Proto: https). Lax, not Strict: a link to the console from
another site (a chat, an alert) must open it signed in. Lax still keeps the cookie off every
cross-site POST, fetch, image and frame, and every state change is a POST that must also carry
the session's CSRF token; no GET changes anything. This module only reads and writes the
cookie; which page needs which role is the views' business.
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING, NamedTuple

from flask import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from ...engine.errors import DatabaseUnavailable
from ...engine.settings import CONSOLE_SESSION_KEY_MIN_CHARS, ApiSettings, ApiToken, Settings
from ..auth import ANONYMOUS, Principal

if TYPE_CHECKING:
    from ...engine.store import Store
    from ..replica import Replica

COOKIE = "skiplock_console"
# A session lasts a working day; signing in again takes one paste of the token.
MAX_AGE_SECONDS = 8 * 3600
# what a console without SKIPLOCK_CONSOLE_SESSION_KEY answers, and logs once at start
DISABLED = ("the console is disabled: set SKIPLOCK_CONSOLE_SESSION_KEY (or _FILE) to a random secret "
            f"of at least {CONSOLE_SESSION_KEY_MIN_CHARS} characters, the same in every API process")


def cookie_options(request: Request, samesite: str = "Strict") -> dict:
    """How the console's cookies are set: for the console's paths only, out of scripts' reach,
    sent by another site at most on a top-level navigation (Lax), over HTTPS only when the request
    came that way."""
    secure = request.is_secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
    return dict(path=request.script_root + "/", httponly=True, samesite=samesite, secure=secure)


class Session(NamedTuple):
    csrf: str
    principal: Principal | None  # None: not signed in (the login form still needs its CSRF token)
    session_id: str = ""  # a signed-in session's own id: what sign-out records
    generation: int = 0  # its token's sign-out generation when it was opened


class Sessions:
    def __init__(self, settings: ApiSettings, auth_enabled: bool, store: "Store", replica: "Replica | None" = None):
        self.store = store  # the primary's: sign-outs are written there, and a POST's session read
        self.replica = replica  # SKIPLOCK_READ_DATABASE_URL's, for a page's session read
        self.key_missing = settings.console_session_key is None
        self._serializer = None if self.key_missing else URLSafeTimedSerializer(
            settings.console_session_key.encode(), salt="skiplock.console")
        self._tokens = {t.name: t for t in settings.api_tokens}
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
        token = self._tokens.get(name)
        if token is None or not hmac.compare_digest(str(data.get("t")), _fingerprint(token)):
            return None  # revoked, or rotated since this session was opened with it
        session_id, generation = data.get("s"), data.get("g")
        if not isinstance(session_id, str) or not session_id or not isinstance(generation, int):
            return None  # a cookie from before sessions had ids: it cannot be signed out, so sign in again
        if self._ended(request.method, session_id, name, generation):
            return None  # signed out, or every session of its token was
        return Session(data["c"], Principal(name, token.role), session_id, generation)

    def _ended(self, method: str, session_id: str, name: str, generation: int) -> bool:
        replica = self.replica
        if method == "GET" and replica is not None and replica.refusal() is None:
            try:
                return replica.store.console_sessions.console_session_ended(session_id, name, generation)
            except DatabaseUnavailable as exc:  # as a routed read does: the primary answers instead
                replica.failed(exc)
        return self.store.console_sessions.console_session_ended(session_id, name, generation)

    def new(self, principal: Principal | None) -> Session:
        """A new session (a fresh CSRF token, so signing in never keeps a token seen before)."""
        if principal is None or not self.auth_enabled:
            return Session(secrets.token_urlsafe(32), principal)
        generation = self.store.console_sessions.console_token_generation(principal.name)
        return Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(16), generation)

    def end(self, session: Session | None) -> None:
        """Sign-out: the session's cookie, wherever a copy of it is, no longer signs anyone in."""
        if session is not None and session.session_id:
            self.store.console_sessions.console_session_end(session.session_id, MAX_AGE_SECONDS)

    def write(self, response: Response, request: Request, session: Session) -> None:
        data = {"c": session.csrf}
        if session.principal is not None and self.auth_enabled:
            data["n"] = session.principal.name
            data["t"] = _fingerprint(self._tokens[session.principal.name])
            data["s"], data["g"] = session.session_id, session.generation
        response.set_cookie(COOKIE, self._serializer.dumps(data), max_age=MAX_AGE_SECONDS,
                            **cookie_options(request, samesite="Lax"))

    @staticmethod
    def csrf_ok(session: Session | None, supplied: str | None) -> bool:
        return session is not None and bool(supplied) and hmac.compare_digest(session.csrf, supplied)


def with_run_key(settings: Settings | ApiSettings) -> Settings | ApiSettings:
    """`settings`, with a random key for this run when authentication is disabled and no key is
    set: such a session names nobody (everyone is admin) and carries only its CSRF token, so a
    key that ends with the run costs an open page one reload, never a sign-in, and none has to be
    configured. Call it once, before any worker forks, so that all of the run's processes share
    it; API processes apart from one another (pods) still need SKIPLOCK_CONSOLE_SESSION_KEY."""
    if settings.console_session_key is None and settings.api_auth == "disabled":
        return settings.replace(console_session_key=secrets.token_urlsafe(32))
    return settings


def _fingerprint(token: ApiToken) -> str:
    """Which of a name's tokens a session was opened with (not a secret: the list holds it)."""
    return token.sha256[:16]

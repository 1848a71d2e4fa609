"""`skiplock tokens new`: an API credential (reads no settings and opens no database); `skiplock
tokens sign-out NAME`: ends every console session opened with that token, at once and on every API
process (audited as `console.sign_out_all`, actor `cli:<os user>`)."""

from __future__ import annotations

from ..engine.settings import API_ROLES, check_name


def add_parsers(sub) -> None:
    tk = sub.add_parser("tokens", help="make API credentials (SKIPLOCK_API_TOKENS entries)")
    tks = tk.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = tks.add_parser("new", help="print a new random token (shown once) and its SKIPLOCK_API_TOKENS entry")
    new.add_argument("--name", required=True, help="who uses it; the audit log's actor")
    new.add_argument("--role", required=True, choices=API_ROLES, help="what it may do")
    out = tks.add_parser("sign-out", help="end every console session opened with that token (a leaked cookie, "
                                          "a person who left); its holder signs in again")
    out.add_argument("name", help="the token's name (its SKIPLOCK_API_TOKENS entry)")
    tk.set_defaults(run=run)


def run(args) -> int:
    if args.action == "sign-out":
        return _sign_out(args.name)
    return _new_token(args.name, args.role)


def _sign_out(name: str) -> int:
    from ..engine.settings import Settings
    from .command import audited, open_store

    check_name("token", name)
    store = open_store(Settings.from_env())
    try:
        with audited(store, "console.sign_out_all", name) as (tx, change):
            generation = tx.console_sessions.console_token_sign_out(name)
            change.detail = {"generation": generation}
    finally:
        store.close()
    print(f"every console session of token {name!r} is ended: its holder signs in again")
    return 0


def _new_token(name: str, role: str) -> int:
    """A token only its holder knows: the API is configured with its SHA-256 (api/auth.py)."""
    import hashlib
    import secrets

    check_name("token", name)
    token = "skl_" + secrets.token_urlsafe(32)  # the prefix lets secret scanners spot a leaked one
    digest = hashlib.sha256(token.encode()).hexdigest()
    print(f"token: {token}   (shown once: the client sends `Authorization: Bearer <token>`)")
    print(f"entry: {name}:{role}:{digest}   (add to SKIPLOCK_API_TOKENS, comma-separated)")
    return 0

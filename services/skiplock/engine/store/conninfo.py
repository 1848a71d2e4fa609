"""Checking a libpq connection string (URL or key=value) before anything connects with it.

libpq's parse errors quote the offending fragment, and psycopg raises them with the whole string
in its traceback, so a malformed URL used to print its password. Here a malformed one becomes a
one-line ConfigError naming the variable; libpq's reason keeps its wording, but any fragment it
quotes is dropped (it may be the password, or a URL that holds it), and the value is never shown.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import conninfo as _conninfo

from ..errors import ConfigError

# a quoted fragment of libpq's message; a lone punctuation mark ("=", "]") cannot hold a secret
_QUOTED = re.compile(r'"([^"]*)"')
_PUNCTUATION = re.compile(r"[=\[\]@:/?&%]")


def _without_fragments(reason: str) -> str:
    return _QUOTED.sub(lambda m: m[0] if _PUNCTUATION.fullmatch(m[1]) else '"…"', " ".join(reason.split()))


def check_database_url(variable: str, value: str | None) -> str | None:
    """`value` if libpq can parse it (None stays None); else ConfigError, one line, no secret."""
    if value is None:
        return None
    try:
        _conninfo.conninfo_to_dict(value)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"{variable}: not a valid libpq URL or key=value string ({_without_fragments(str(exc))}); "
                          "the value is not shown, since it may hold a password") from None
    return value


def libpq_conninfo(params: dict) -> str:
    """A key=value string of the libpq parameters among `params` (a driver's connect() keywords,
    such as Django's connection parameters): other keys, and empty values, are left out."""
    known = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
    return _conninfo.make_conninfo(**{k: v for k, v in params.items() if k in known and v not in (None, "")})

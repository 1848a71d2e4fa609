"""Flow control's definitions: a limit per task kind (a concurrency limit, a rate limit with its
burst, or both), parsed and validated once, from the CLI's flags, the API's JSON or a limits
file; and the operator's actions on them (set, delete, apply a file), each one transaction of
the store's statements.

The limits live in the database (skiplock.limits), not here: every worker's claim reads them,
so every worker enforces the same limits whatever version of the code it runs (migration 0016,
docs/ARCHITECTURE.md "Flow control"). A limit applies per (kind, concurrency_key) group.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .definition_files import load_definitions
from .errors import InvalidInput
from .settings import check_name

# the period of a rate: N/s, N/m, N/h, N/d, or N/<number><unit> (5/10s: five per ten seconds)
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*$")
_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60,
                 "h": 3600, "hour": 3600, "d": 86400, "day": 86400}
# a limit's numbers fit the table's integer columns
_MAX_INT = 2**31 - 1


def _positive_int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_INT:
        raise InvalidInput(f"{field} {value!r}: must be a positive integer")
    return value


def parse_rate(text: Any) -> tuple[int, float]:
    """'100/s' → (100, 1.0); '5/10s' → (5, 10.0); '30/m' → (30, 60.0)."""
    if not isinstance(text, str):
        raise InvalidInput(f"rate {text!r}: expected N/s, N/m, N/h or N/d (e.g. 100/s)")
    match = _RATE.match(text)
    if not match:
        raise InvalidInput(f"rate {text!r}: expected N/s, N/m, N/h or N/d (e.g. 100/s)")
    count, every, unit = int(match.group(1)), match.group(2), match.group(3)
    if not 1 <= count <= _MAX_INT:
        raise InvalidInput(f"rate {text!r}: the count must be a positive integer")
    seconds = (float(every) if every else 1.0) * _UNIT_SECONDS[unit]
    if not seconds > 0:
        raise InvalidInput(f"rate {text!r}: the period must be longer than 0")
    return count, seconds


def format_rate(count: int, seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds == length:
            return f"{count}/{unit}"
    return f"{count}/{seconds:g}s"


@dataclasses.dataclass(frozen=True)
class Limit:
    """A kind's limit, per group: at most `concurrency` runs at once; at most `rate_count` starts
    per `rate_seconds`, up to `burst` at once (a token bucket on the database's clock)."""

    kind: str
    concurrency: int | None = None
    rate_count: int | None = None
    rate_seconds: float | None = None
    burst: int | None = None

    def __post_init__(self):
        check_name("task kind", self.kind)
        if self.concurrency is not None:
            _positive_int("concurrency", self.concurrency)
        if (self.rate_count is None) != (self.rate_seconds is None):
            raise InvalidInput("rate: give its count and its period together")
        if self.rate_count is not None:
            _positive_int("rate count", self.rate_count)
            if not (isinstance(self.rate_seconds, (int, float)) and not isinstance(self.rate_seconds, bool)
                    and math.isfinite(self.rate_seconds) and self.rate_seconds > 0):
                raise InvalidInput(f"rate period {self.rate_seconds!r}: must be a number of seconds > 0")
            if self.burst is None:
                # one second's worth of starts at once (at least one): enough that claims a few
                # milliseconds apart reach the rate, and no more than a second ahead of it
                object.__setattr__(self, "burst", max(1, math.ceil(self.rate_count / self.rate_seconds)))
            _positive_int("burst", self.burst)
        elif self.burst is not None:
            raise InvalidInput("burst: only with a rate (--rate)")
        if self.concurrency is None and self.rate_count is None:
            raise InvalidInput(f"limit of {self.kind!r}: give a concurrency, a rate, or both")

    @classmethod
    def build(cls, kind: str, concurrency: Any = None, rate: Any = None, burst: Any = None) -> "Limit":
        """From the CLI's and the API's fields: rate as text ('100/s')."""
        count, seconds = parse_rate(rate) if rate is not None else (None, None)
        return cls(kind, concurrency, count, seconds, burst)

    @classmethod
    def from_mapping(cls, entry: Any) -> "Limit":
        """One entry of a limits file or of the API's body: kind, concurrency, rate, burst."""
        if not isinstance(entry, Mapping):
            raise InvalidInput("expected a mapping with kind, and concurrency and/or rate (and burst)")
        unknown = sorted(set(entry) - {"kind", "concurrency", "rate", "burst"})
        if unknown:
            raise InvalidInput(f"unknown field {unknown[0]!r} (fields: kind, concurrency, rate, burst)")
        if "kind" not in entry:
            raise InvalidInput("kind: required")
        return cls.build(entry["kind"], entry.get("concurrency"), entry.get("rate"), entry.get("burst"))

    @property
    def rate(self) -> str | None:
        return None if self.rate_count is None else format_rate(self.rate_count, self.rate_seconds)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "concurrency": self.concurrency, "rate": self.rate,
                "rate_per_second": None if self.rate_count is None else self.rate_count / self.rate_seconds,
                "burst": self.burst}


def load_file(path: str, source: str = "-f") -> list[Limit]:
    """Limits from a YAML (or JSON) file: a list, or a mapping with a `limits` list, shaped like
    the schedules file. Errors name the file, the entry and the field; nothing is applied
    unless all are valid."""
    return load_definitions(path, source, "limits", "kind", Limit.from_mapping)


def apply_limits(store, limits: Sequence[Limit], *, prune: bool = False) -> dict[str, list[str]]:
    """Set every limit of `limits` in one transaction; `prune` deletes the limits of kinds not
    among them. Returns the kinds {'created': [...], 'updated': [...], 'unchanged': [...],
    'deleted': [...]}. Takes effect at each worker's next claim."""
    kinds = [limit.kind for limit in limits]
    duplicates = sorted({k for k in kinds if kinds.count(k) > 1})
    if duplicates:
        raise InvalidInput(f"kind {duplicates[0]!r}: limited more than once")
    report: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "deleted": []}
    with store.transaction() as tx:
        for limit in limits:
            created = tx.limits.limit_upsert(limit)
            report["unchanged" if created is None else "created" if created else "updated"].append(limit.kind)
        if prune:
            doomed = [k for k in tx.limits.limit_kinds() if k not in set(kinds)]
            report["deleted"] = tx.limits.limit_delete(doomed) if doomed else []
    return report

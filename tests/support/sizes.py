"""Sizes of the reliability scenarios: the CI-sized form that `make test` runs, or the full-sized
one with SKIPLOCK_RELIABILITY=full (`make reliability`)."""

from __future__ import annotations

import os

FULL = os.environ.get("SKIPLOCK_RELIABILITY", "") == "full"


def sized(ci: int | float, full: int | float):
    """`full` under `make reliability`, else `ci`."""
    return full if FULL else ci

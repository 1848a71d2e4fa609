"""The package's public names (issue 35): the errors a caller catches come from `skiplock`
itself, are the engine's own classes (so `except skiplock.InvalidInput` catches what enqueue
raises), and each public name is in docs/CONTRACT.md."""

from __future__ import annotations

import skiplock
from skiplock.engine import errors
from tests.support.harness import ROOT

CAUGHT = ("SkiplockError", "InvalidInput", "PayloadTooLarge", "WaitTimeout", "TaskNotFound", "DatabaseUnavailable",
          "ConnectionLost", "MigrationError", "ConfigError")


def test_the_errors_callers_catch_are_the_packages_names():
    for name in CAUGHT:
        assert name in skiplock.__all__, name
        assert getattr(skiplock, name) is getattr(errors, name)
    assert issubclass(skiplock.ConnectionLost, skiplock.DatabaseUnavailable)
    assert issubclass(skiplock.WaitTimeout, TimeoutError)


def test_every_public_name_is_in_the_contract():
    contract = (ROOT / "docs" / "CONTRACT.md").read_text()
    missing = [name for name in skiplock.__all__ if name not in contract]
    assert missing == []

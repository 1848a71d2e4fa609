"""settings.VARIABLES is the one declaration of every SKIPLOCK_* variable: from_env() reads its
defaults, and the docs' configuration tables are written from it (tests/unit/test_generated_docs.py).
These tests keep the declaration and the parser in step: a variable read and not declared, or
declared and never read, fails here."""

from __future__ import annotations

import re

from skiplock.engine import settings
from skiplock.engine.settings import VARIABLES, EnvReader, Settings
from tests.support.harness import ROOT


def _read_by_from_env(monkeypatch) -> list[str]:
    names: list[str] = []
    raw = EnvReader.raw

    def recording(self, name):
        names.append(name)
        return raw(self, name)

    monkeypatch.setattr(EnvReader, "raw", recording)
    Settings.from_env({})
    return names


def test_from_env_reads_every_parsed_variable_and_no_other(monkeypatch):
    read = _read_by_from_env(monkeypatch)
    assert len(read) == len(set(read)), "a variable is read twice"
    assert sorted(read) == sorted(v.name for v in VARIABLES if v.parsed)


def test_the_declared_defaults_are_the_settings_defaults():
    """With nothing set, from_env() (declared defaults) builds the same settings as Settings()
    (the dataclass's defaults): the two can only drift apart by failing here."""
    assert Settings.from_env({}) == Settings()


def test_every_variable_is_declared_once_with_a_meaning_and_a_group():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    for v in VARIABLES:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", v.name), v.name
        assert v.meaning.strip(), v.name
        assert v.group in settings.GROUPS, v.name
        assert "\n" not in v.meaning + v.more + (v.shown or ""), f"{v.name}: a table cell is one line"


def test_a_read_without_a_default_needs_a_declaration():
    env = EnvReader({})
    assert env.number("REAPER_SECONDS") == 5.0
    assert env.number("NOT_DECLARED", 1.5) == 1.5
    try:
        env.number("NOT_DECLARED")
    except LookupError as exc:
        assert "SKIPLOCK_NOT_DECLARED" in str(exc)
    else:
        raise AssertionError("an undeclared variable read without a default")


def test_variables_read_outside_from_env_are_declared():
    """Code outside engine/settings/ that reads a SKIPLOCK_* variable itself (os.environ, an EnvReader)
    reads a declared one; a declared variable that from_env() does not parse is read somewhere."""
    declared = {v.name for v in VARIABLES}
    package = ROOT / "services" / "skiplock"
    sources = [p for p in package.rglob("*.py") if p.parent != package / "engine" / "settings"]
    read_elsewhere = set()
    for path in sources:
        text = path.read_text()
        read_elsewhere |= set(re.findall(r"environ(?:\.get\(|\[)\s*[\"']SKIPLOCK_([A-Z0-9_]+)[\"']", text))
        read_elsewhere |= set(re.findall(r"EnvReader\([^)]*\)\.\w+\(\s*[\"']([A-Z0-9_]+)[\"']", text))
    assert read_elsewhere - declared == set()
    assert {v.name for v in VARIABLES if not v.parsed} <= read_elsewhere

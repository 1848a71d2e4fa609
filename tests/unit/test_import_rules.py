"""The import rules of services/skiplock, checked over its import graph (read with ast, nothing
imported):

- no role imports another role, and the engine imports no role (nor the CLI or the dev mode);
- the modules the API and the CLI share (validation, the JSON of answers) import no Flask or
  werkzeug, and no CLI module imports them: only the API's own modules do;
- no import cycle anywhere in the package.

Every import counts, at module level or inside a function: a function's import still ties the
two modules together, only later. Imports under `if TYPE_CHECKING:` count for the layer rules
(naming another role's type is depending on it) but not for cycles: they never run, and they
are how a type is named across what would otherwise be a loop.
"""

from __future__ import annotations

from tests.support.import_graph import GRAPH, MODULES, cycles, loop

ROLES = ("skiplock.worker", "skiplock.scheduler", "skiplock.dispatcher", "skiplock.api")
# importer (a module or a package's prefix) -> what it must not import, with the reason
RULES = {
    "skiplock.worker": (("skiplock.scheduler", "skiplock.dispatcher", "skiplock.api"), "no role imports another"),
    "skiplock.scheduler": (("skiplock.worker", "skiplock.dispatcher", "skiplock.api"), "no role imports another"),
    "skiplock.dispatcher": (("skiplock.worker", "skiplock.scheduler", "skiplock.api"), "no role imports another"),
    "skiplock.api": (("skiplock.worker", "skiplock.scheduler", "skiplock.dispatcher"), "no role imports another"),
    "skiplock.engine": ((*ROLES, "skiplock.cli", "skiplock.dev"), "the engine is below every role"),
    "skiplock.cli": (("flask", "werkzeug"), "a command loads Flask only through the API it starts"),
    "skiplock.api.schema": (("flask", "werkzeug"), "validation the CLI shares"),
    "skiplock.api.request_body": (("flask", "werkzeug"), "reads a body from any stream, as schema validates"),
    "skiplock.api.render": (("flask", "werkzeug"), "answers the CLI prints"),
    "skiplock.api.listings": (("flask", "werkzeug"), "answers the CLI prints"),
}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations() -> list[str]:
    out = []
    for importer, imports in GRAPH.items():
        for prefix, (forbidden, why) in RULES.items():
            if not _under(importer, prefix):
                continue
            for imported, line, _typing in imports:
                if any(_under(imported, f) for f in forbidden):
                    out.append(f"{importer}:{line} imports {imported} ({why})")
    return sorted(set(out))


def test_the_graph_sees_the_package():
    # a reader that found no imports would pass every rule
    assert len(MODULES) > 50
    assert "skiplock.engine.settings" in {i for i, _, _ in GRAPH["skiplock.cli.command"]}
    assert "skiplock.api" in {i for i, _, _ in GRAPH["skiplock.cli.roles"]}  # a function's import


def test_the_import_rules_hold():
    assert violations() == []


def test_no_import_cycles():
    assert [loop(group) for group in cycles()] == []

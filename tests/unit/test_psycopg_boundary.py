"""Only the store package, the listener and migrations talk to the driver: every other module
gets skiplock errors and the store's methods, so a change of driver or of error handling has
one place to go."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "skiplock"
ALLOWED = {"engine/store/", "worker/listener.py", "engine/migrate.py"}


def _imports_psycopg(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "psycopg" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "psycopg":
            return True
    return False


def test_psycopg_is_imported_only_by_the_store_the_listener_and_migrate():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel.startswith(a) for a in ALLOWED):
            continue
        if _imports_psycopg(path):
            offenders.append(rel)
    assert offenders == []

"""No `skiplock` command loads Flask or werkzeug unless it starts the API (`skiplock api`, and
`skiplock dev`, which runs every role): the commands validate and print with the modules the API
shares without Flask (api/schema.py, api/render.py, api/listings.py).

Checked in a fresh interpreter: import every CLI module and every module their functions import
(tests/support/import_graph.py), run a few commands that stop at their validation,
and look at sys.modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.import_graph import GRAPH

# the commands that start the API import these when they run
STARTS_THE_API = {"skiplock.dev", "skiplock.api.app", "skiplock.api.server"}

PROBE = """
import contextlib, importlib, io, json, sys
from skiplock.cli import main
for name in {modules!r}:
    importlib.import_module(name)
with contextlib.redirect_stderr(io.StringIO()):
    codes = [main(argv) for argv in {commands!r}]
print(json.dumps({{"codes": codes, "loaded": sorted(n for n in sys.modules if n.split(".")[0] in ("flask", "werkzeug"))}}))
"""


def _cli_imports() -> list[str]:
    names = set()
    for module, imports in GRAPH.items():
        if module == "skiplock.cli" or module.startswith("skiplock.cli."):
            names.add(module)
            names |= {i for i, _, _ in imports if i in GRAPH and i not in STARTS_THE_API}
    names.discard("skiplock.cli.__main__")  # it runs the command
    return sorted(names)


def test_the_cli_imports_no_flask_or_werkzeug():
    modules = _cli_imports()
    assert "skiplock.api.listings" in modules and "skiplock.cli.tasks" in modules
    commands = [["tasks", "list", "--limit", "0"], ["audit", "list", "--cursor", "x"],
                ["queues", "pause", "two words"], ["tokens", "new", "--name", "ci", "--role", "reader"]]
    done = subprocess.run([sys.executable, "-c", PROBE.format(modules=modules, commands=commands)],
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["codes"] == [1, 1, 1, 0]  # refused before any database, and a token made
    assert answer["loaded"] == []

"""The `skiplock` command. Thin: parse arguments, build settings, call the role's entry.

Each module here adds one group of commands (`add_parsers(sub)`) and sets on each the function
that runs it (`set_defaults(run=...)`); command.py holds what the commands share (the actor, the
store, table and JSON output). Importing this package imports no Flask: `skiplock api` loads
it when it starts the API.

Exit codes: 0 done (or stopped by a signal after draining); 1 bad configuration or input, with a
one-line reason on stderr; 2 bad command line (argparse); 3 the worker exited for a clean restart.
"""

from __future__ import annotations

import argparse
import sys

from ..engine.errors import ConfigError, DatabaseUnavailable, SkiplockError
from ..engine.version import package_version
from . import audit, dev, limits, migrate, queues, roles, schedules, signals, tasks, tokens, webhooks, workers

# in the order `skiplock --help` lists them
ADD_PARSERS = (migrate.add_parsers, roles.add_parsers, webhooks.add_parsers, schedules.add_parsers,
               workers.add_parsers, tasks.add_parsers, signals.add_parsers, queues.add_parsers, audit.add_parsers,
               limits.add_parsers, tokens.add_parsers, dev.add_parsers, tasks.add_enqueue_parser)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skiplock", description="A durable task engine on one Postgres.")
    p.add_argument("--version", action="version", version=f"skiplock {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in ADD_PARSERS:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, DatabaseUnavailable, SkiplockError) as exc:
        one_line = " ".join(str(exc).split())  # libpq messages span lines; ours are one
        print(f"skiplock {args.command}: {one_line}", file=sys.stderr)
        return 1

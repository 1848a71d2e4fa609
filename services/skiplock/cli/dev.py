"""`skiplock dev`: every role in one process (the dev mode itself is skiplock/dev.py)."""

from __future__ import annotations

from ..engine.settings import Settings


def add_parsers(sub) -> None:
    d = sub.add_parser("dev", help="every role in one process; embedded Postgres if no URL is set")
    d.add_argument("--no-demo", action="store_true", help="do not enqueue the demo workload")
    d.set_defaults(run=run)


def run(args) -> int:
    from .. import dev

    return dev.main(Settings.from_env(), demo=not args.no_demo)

"""`skiplock migrate [--check] [--distributed]`: apply the pending migrations, or list them; with
--distributed, then spread the tables over a Citus cluster by queue (engine/migrate.py)."""

from __future__ import annotations

from ..engine.settings import Settings


def add_parsers(sub) -> None:
    m = sub.add_parser("migrate", help="apply pending migrations (serialized, idempotent)")
    m.add_argument("--check", action="store_true", help="apply nothing; exit 1 while any is pending")
    m.add_argument("--distributed", action="store_true",
                   help="then distribute the tables by queue over this Citus cluster's worker nodes (once; "
                        "docs/SCALING.md says what changes)")
    m.set_defaults(run=run)


def run(args) -> int:
    from ..engine import migrate

    settings = Settings.from_env()
    url = settings.require_database_url()
    if args.check:
        waiting = migrate.pending(url, settings.db_schema)
        for m in waiting:
            print(f"pending: {m.path.name}")
        if waiting:
            return 1
        print("up to date")
        return 0
    applied = migrate.apply(url, settings.db_schema)
    for m in applied:
        print(f"applied: {m.path.name}")
    print("up to date" if not applied else f"{len(applied)} migration(s) applied")
    if args.distributed:
        done = migrate.distribute(url, settings.db_schema)
        print("distributed by queue" if done else "already distributed by queue")
    return 0

"""`skiplock migrate [--check]`: apply the pending migrations, or list them."""

from __future__ import annotations

from ..engine.settings import Settings


def add_parsers(sub) -> None:
    m = sub.add_parser("migrate", help="apply pending migrations (serialized, idempotent)")
    m.add_argument("--check", action="store_true", help="apply nothing; exit 1 while any is pending")
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
    return 0

"""The `skiplock` command. Thin: parse arguments, build settings, call the role's entry.

Exit codes: 0 done (or stopped by a signal after draining); 1 bad configuration or input, with a
one-line reason on stderr; 2 bad command line (argparse); 3 the worker exited for a clean restart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from .engine.errors import ConfigError, DatabaseUnavailable, SkiplockError
from .engine.settings import Settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skiplock", description="A durable task engine on one Postgres.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("migrate", help="apply pending migrations (serialized, idempotent)")
    m.add_argument("--check", action="store_true", help="apply nothing; exit 1 while any is pending")

    w = sub.add_parser("worker", help="claim and run tasks")
    w.add_argument("--queues", help="comma-separated queues (SKIPLOCK_QUEUES)")
    w.add_argument("--concurrency", type=int, help="tasks run at once (SKIPLOCK_CONCURRENCY)")
    w.add_argument("--tasks", help="comma-separated handler modules (SKIPLOCK_TASKS)")

    d = sub.add_parser("dev", help="every role in one process; embedded Postgres if no URL is set")
    d.add_argument("--no-demo", action="store_true", help="do not enqueue the demo workload")

    e = sub.add_parser("enqueue", help="enqueue one task and print its id")
    e.add_argument("kind")
    e.add_argument("--payload", default="{}", help="JSON payload (default {})")
    e.add_argument("--queue", default="default")
    e.add_argument("--priority", type=int, default=0, help="higher runs first")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="seconds from now")
    when.add_argument("--run-at", help="ISO 8601 time with a UTC offset")
    e.add_argument("--idempotency-key")
    e.add_argument("--max-attempts", type=int, help="default: the kind's (3 if undeclared)")
    return p


def _names(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (ConfigError, DatabaseUnavailable, SkiplockError) as exc:
        one_line = " ".join(str(exc).split())  # libpq messages span lines; ours are one
        print(f"skiplock {args.command}: {one_line}", file=sys.stderr)
        return 1


def _run(args) -> int:
    if args.command == "migrate":
        from .engine import migrate

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

    if args.command == "worker":
        from . import worker

        settings = Settings.from_env(queues=_names(args.queues), concurrency=args.concurrency,
                                     tasks=_names(args.tasks))
        return worker.main(settings)

    if args.command == "dev":
        from . import dev

        return dev.main(Settings.from_env(), demo=not args.no_demo)

    if args.command == "enqueue":
        from .engine.errors import InvalidInput
        from .enqueueing import enqueue

        settings = Settings.from_env()
        try:
            payload = json.loads(args.payload)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--payload is not valid JSON: {exc}") from None
        run_at = None
        if args.run_at:
            try:
                run_at = dt.datetime.fromisoformat(args.run_at)
            except ValueError:
                raise InvalidInput(f"--run-at {args.run_at!r}: not an ISO 8601 time") from None
            if run_at.tzinfo is None:
                raise InvalidInput(f"--run-at {args.run_at!r}: add a UTC offset, e.g. 2030-01-01T09:00:00+00:00")
        task_id = enqueue(settings.require_database_url(), args.kind, payload, queue=args.queue,
                          priority=args.priority, delay=args.delay, run_at=run_at,
                          idempotency_key=args.idempotency_key, max_attempts=args.max_attempts,
                          schema=settings.db_schema)
        print(task_id)
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())

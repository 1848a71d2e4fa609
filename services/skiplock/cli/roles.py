"""`skiplock worker|scheduler|api|dispatcher`: start one role in this process.

Each role's package is imported only when its command runs: `skiplock api` is the one command
that loads Flask.
"""

from __future__ import annotations

from ..engine.settings import Settings


def add_parsers(sub) -> None:
    w = sub.add_parser("worker", help="claim and run tasks")
    w.add_argument("--queues", help="comma-separated queues (SKIPLOCK_QUEUES)")
    w.add_argument("--concurrency", type=int, help="tasks run at once (SKIPLOCK_CONCURRENCY)")
    w.add_argument("--tasks", help="comma-separated handler modules (SKIPLOCK_TASKS)")
    w.add_argument("--django", metavar="SETTINGS",
                   help="run Django's tasks (django.tasks): set up Django with this settings module first")
    w.set_defaults(run=run_worker)

    sub.add_parser("scheduler", help="fire due schedules, reclaim expired leases, export queue gauges"
                   ).set_defaults(run=run_scheduler)

    api = sub.add_parser("api", help="the HTTP API under gunicorn")
    api.add_argument("--bind", default="0.0.0.0:8080", help="HOST:PORT to listen on (default 0.0.0.0:8080)")
    api.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default 2)")
    api.add_argument("--threads", type=int, default=4, help="request threads per worker (default 4)")
    api.set_defaults(run=run_api)
    sub.add_parser("dispatcher", help="deliver outbox events to webhook endpoints").set_defaults(run=run_dispatcher)


def _names(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def run_worker(args) -> int:
    from .. import worker

    settings = Settings.from_env(queues=_names(args.queues), concurrency=args.concurrency,
                                 tasks=_names(args.tasks))
    return worker.main(settings, django_settings=args.django)


def run_scheduler(args) -> int:
    from .. import scheduler

    return scheduler.main(Settings.from_env())


def run_api(args) -> int:
    from .. import api

    return api.main(Settings.from_env(), bind=args.bind, workers=args.workers, threads=args.threads)


def run_dispatcher(args) -> int:
    from .. import dispatcher

    return dispatcher.main(Settings.from_env())

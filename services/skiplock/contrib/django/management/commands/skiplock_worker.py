"""`manage.py skiplock_worker`: `skiplock worker` for this project's Django tasks (the settings
manage.py chose); the same options, and the same SKIPLOCK_* variables."""

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Claim and run this project's Django tasks (skiplock worker --django with these settings)."
    requires_system_checks = []  # the worker's own checks run when it starts; a migration check would need a connection

    def add_arguments(self, parser):
        parser.add_argument("--queues", help="comma-separated queues (SKIPLOCK_QUEUES)")
        parser.add_argument("--concurrency", type=int, help="tasks run at once (SKIPLOCK_CONCURRENCY)")
        parser.add_argument("--tasks", help="more comma-separated modules to import (SKIPLOCK_TASKS)")

    def handle(self, *args, **options):
        from skiplock import worker
        from skiplock.cli.roles import _names
        from skiplock.engine.errors import SkiplockError
        from skiplock.engine.settings import Settings

        try:
            settings = Settings.from_env(queues=_names(options["queues"]), concurrency=options["concurrency"],
                                         tasks=_names(options["tasks"]))
            code = worker.main(settings, with_django=True)
        except SkiplockError as exc:
            self.stderr.write(f"skiplock_worker: {' '.join(str(exc).split())}")  # one line, as `skiplock worker` says it
            raise SystemExit(1) from None
        raise SystemExit(code)

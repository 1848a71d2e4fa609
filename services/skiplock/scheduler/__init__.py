"""The scheduler role: `skiplock scheduler`. See scheduler/scheduler.py."""

from __future__ import annotations

import logging


def main(settings) -> int:
    """Entry: settings -> logging -> metrics -> store -> schedules and limits files -> scheduler -> run."""
    from ..engine import logs, migrate
    from ..engine import limits
    from ..engine.lifecycle import run_role
    from ..engine.schedule_actions import apply_schedules
    from ..engine.schedules import load_file
    from ..engine.settings import SchedulerSettings
    from .scheduler import Scheduler

    settings = SchedulerSettings.of(settings)  # the scheduler's variables, and no other
    logs.setup(settings.log_format, settings.log_level)
    url = settings.require_database_url()
    migrate.require_current(url, settings.db_schema)
    definitions = load_file(settings.schedules_file, "SKIPLOCK_SCHEDULES_FILE") if settings.schedules_file else None
    limit_definitions = (limits.load_file(settings.limits_file, "SKIPLOCK_LIMITS_FILE")
                         if settings.limits_file else None)

    def apply_file(store) -> None:
        if definitions is not None:
            report = apply_schedules(store, definitions, prune=settings.schedules_prune,
                                            max_payload_bytes=settings.max_payload_bytes)
            # `created` is a LogRecord attribute: prefix the counts so they never collide
            logging.getLogger("skiplock.scheduler").info(
                "schedules file applied", extra={"file": settings.schedules_file,
                                                 **{f"schedules_{k}": len(v) for k, v in report.items()}})
        if limit_definitions is not None:
            report = limits.apply_limits(store, limit_definitions, prune=settings.limits_prune)
            logging.getLogger("skiplock.scheduler").info(
                "limits file applied", extra={"file": settings.limits_file,
                                              **{f"limits_{k}": len(v) for k, v in report.items()}})

    return run_role(settings, "scheduler", lambda store, metrics, stop: Scheduler(settings, store, metrics, stop),
                    pool_max=3, prepare=apply_file)

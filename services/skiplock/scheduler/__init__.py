"""The scheduler role: `skiplock scheduler`. See scheduler/scheduler.py."""

from __future__ import annotations


def main(settings) -> int:
    """Entry: settings -> logging -> metrics -> store -> schedules file -> scheduler -> run."""
    from ..engine import logs, migrate
    from ..engine.lifecycle import Stop, install_signal_handlers
    from ..engine.metrics import Metrics, MetricsServer
    from ..engine.schedules import load_file
    from ..engine.store import Store
    from .scheduler import Scheduler

    logs.setup(settings.log_format, settings.log_level)
    url = settings.require_database_url()
    migrate.require_current(url, settings.db_schema)
    definitions = load_file(settings.schedules_file, "SKIPLOCK_SCHEDULES_FILE") if settings.schedules_file else None
    stop = Stop()
    install_signal_handlers(stop)
    metrics = Metrics()
    store = Store(url, settings.db_schema, min_size=1, max_size=3, name="scheduler").open()
    try:
        if definitions is not None:
            report = store.apply_schedules(definitions, prune=settings.schedules_prune)
            # `created` is a LogRecord attribute: prefix the counts so they never collide
            logs.logging.getLogger("skiplock.scheduler").info(
                "schedules file applied", extra={"file": settings.schedules_file,
                                                 **{f"schedules_{k}": len(v) for k, v in report.items()}})
        scheduler = Scheduler(settings, store, metrics=metrics, stop=stop)
        server = MetricsServer(metrics, settings.metrics_port, scheduler.ready).start()
        try:
            return scheduler.run()
        finally:
            server.stop()
    finally:
        store.close()

"""The worker role: `skiplock worker`. See worker/worker.py."""

from __future__ import annotations


def main(settings) -> int:
    """Entry: settings -> logging -> metrics -> store -> worker -> run. Returns the exit code."""
    from ..engine import logs
    from ..engine.errors import ConfigError
    from ..engine.handlers import REGISTRY, import_task_modules
    from ..engine.lifecycle import Stop, install_signal_handlers
    from ..engine.metrics import Metrics, MetricsServer
    from ..engine.store import Store
    from .worker import Worker

    logs.setup(settings.log_format, settings.log_level)
    url = settings.require_database_url()
    from ..engine import migrate

    migrate.require_current(url, settings.db_schema)
    import_task_modules(settings.tasks)
    if not len(REGISTRY):
        raise ConfigError("SKIPLOCK_TASKS: no task handlers registered; name the modules that define "
                          "them (e.g. SKIPLOCK_TASKS=myapp.tasks)")
    stop = Stop()
    install_signal_handlers(stop)
    metrics = Metrics()
    store = Store(url, settings.db_schema, min_size=2, max_size=settings.concurrency + 4, name="worker").open()
    worker = Worker(settings, store, metrics=metrics, stop=stop)
    server = MetricsServer(metrics, settings.metrics_port, worker.ready).start()
    try:
        return worker.run()
    finally:
        server.stop()
        store.close()

"""The dispatcher role: `skiplock dispatcher`. See dispatcher/dispatcher.py."""

from __future__ import annotations


def main(settings) -> int:
    """Entry: settings -> logging -> metrics -> store -> dispatcher -> run."""
    from ..engine import logs, migrate
    from ..engine.errors import ConfigError
    from ..engine.lifecycle import Stop, install_signal_handlers
    from ..engine.metrics import Metrics, MetricsServer
    from ..engine.store import Store
    from .dispatcher import Dispatcher

    logs.setup(settings.log_format, settings.log_level)
    if settings.shutdown_grace_seconds >= settings.webhook_lease_seconds:
        raise ConfigError(f"SKIPLOCK_SHUTDOWN_GRACE_SECONDS={settings.shutdown_grace_seconds:g}: must be < "
                          f"SKIPLOCK_WEBHOOK_LEASE_SECONDS ({settings.webhook_lease_seconds:g})")
    url = settings.require_database_url()
    migrate.require_current(url, settings.db_schema)
    stop = Stop()
    install_signal_handlers(stop)
    metrics = Metrics()
    store = Store(url, settings.db_schema, min_size=1, max_size=4, name="dispatcher").open()
    dispatcher = Dispatcher(settings, store, metrics=metrics, stop=stop)
    server = MetricsServer(metrics, settings.metrics_port, dispatcher.ready).start()
    try:
        return dispatcher.run()
    finally:
        server.stop()
        store.close()

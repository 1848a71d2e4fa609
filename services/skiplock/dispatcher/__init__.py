"""The dispatcher role: `skiplock dispatcher`. See dispatcher/dispatcher.py."""

from __future__ import annotations


def main(settings) -> int:
    """Entry: settings -> logging -> metrics -> store -> dispatcher -> run."""
    from ..engine import logs, migrate
    from ..engine.errors import ConfigError
    from ..engine.lifecycle import run_role
    from ..engine.settings import DispatcherSettings
    from .dispatcher import Dispatcher

    settings = DispatcherSettings.of(settings)  # the dispatcher's variables, and no other
    logs.setup(settings.log_format, settings.log_level)
    if settings.shutdown_grace_seconds >= settings.webhook_lease_seconds:
        raise ConfigError(f"SKIPLOCK_SHUTDOWN_GRACE_SECONDS={settings.shutdown_grace_seconds:g}: must be < "
                          f"SKIPLOCK_WEBHOOK_LEASE_SECONDS ({settings.webhook_lease_seconds:g})")
    url = settings.require_database_url()
    migrate.require_current(url, settings.db_schema)
    return run_role(settings, "dispatcher", lambda store, metrics, stop: Dispatcher(settings, store, metrics, stop))

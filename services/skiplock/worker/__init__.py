"""The worker role: `skiplock worker`. See worker/worker.py."""

from __future__ import annotations


def main(settings, django_settings: str | None = None, with_django: bool = False) -> int:
    """Entry: settings -> logging -> metrics -> store -> worker -> run. Returns the exit code.

    django_settings (`--django SETTINGS`), or with_django=True (`manage.py skiplock_worker`, whose
    DJANGO_SETTINGS_MODULE is set): Django is set up first, and its tasks registered
    (skiplock.contrib.django.worker)."""
    from ..engine import logs
    from ..engine.errors import ConfigError
    from ..engine.registry import REGISTRY, import_task_modules
    from ..engine.lifecycle import run_role
    from ..engine.settings import WorkerSettings
    from .worker import Worker, WorkerConfig

    settings = WorkerSettings.of(settings)  # the worker's variables, and no other
    logs.setup(settings.log_format, settings.log_level)
    if django_settings is not None or with_django:
        from ..contrib.django.worker import setup

        settings = setup(django_settings, settings)
    url = settings.require_database_url()
    WorkerConfig.from_settings(settings)  # a refused combination of settings fails before connecting
    from ..engine import migrate

    migrate.require_current(url, settings.db_schema)
    import_task_modules(settings.tasks)
    if not len(REGISTRY):
        raise ConfigError("SKIPLOCK_TASKS: no task handlers registered; name the modules that define "
                          "them (e.g. SKIPLOCK_TASKS=myapp.tasks)")
    return run_role(settings, "worker", lambda store, metrics, stop: Worker(settings, store, metrics=metrics, stop=stop),
                    pool_min=2, pool_max=settings.concurrency + 4, worker_connections=True)

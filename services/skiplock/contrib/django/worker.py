"""Django set up in a worker process, once, before it claims: `skiplock worker --django SETTINGS`
and `manage.py skiplock_worker` both come here.

It sets DJANGO_SETTINGS_MODULE, runs django.setup(), imports each installed app's `tasks` module
(as Celery's autodiscovery does: their @task decorators register the kinds), and, unless
SKIPLOCK_DATABASE_URL or SKIPLOCK_DB_SCHEMA are set, takes the database and schema of the
project's skiplock backend (TASKS "default" if it is one, else the first): its DATABASE_URL, or
the Django database it names, so one settings file configures the web side and the worker.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from skiplock.engine.errors import ConfigError


def setup(settings_module: str | None, settings):
    """Django ready in this process; returns `settings` with the backend's database and schema
    where the environment gives none. Any failure is one ConfigError line."""
    if settings_module is not None:
        if not settings_module.strip():
            raise ConfigError("--django: name the settings module, e.g. --django mysite.settings")
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    if os.getcwd() not in sys.path:  # the project next to the user, as manage.py and SKIPLOCK_TASKS find it
        sys.path.insert(0, os.getcwd())
    try:
        import django
        from django.utils.module_loading import autodiscover_modules

        from . import backend  # noqa: F401 - on a Django without django.tasks, its one line first

        django.setup()
        autodiscover_modules("tasks")
        backend = _skiplock_backend()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - an import, a setting, a task module: one line, where
        raise ConfigError(f"--django {os.environ.get('DJANGO_SETTINGS_MODULE')}: "
                          f"{' '.join(f'{type(exc).__name__}: {exc}'.split())}") from None
    changes = {}
    if not os.environ.get("SKIPLOCK_DATABASE_URL"):
        changes["database_url"] = backend.database_url or _conninfo(backend.database_alias)
    if not os.environ.get("SKIPLOCK_DB_SCHEMA"):
        changes["db_schema"] = backend.schema
    return dataclasses.replace(settings, **changes)


def _skiplock_backend():
    from django.conf import settings as django_settings
    from django.tasks import task_backends

    from .backend import SkiplockBackend

    aliases = list(getattr(django_settings, "TASKS", {}) or {})
    ours = [a for a in aliases if isinstance(task_backends[a], SkiplockBackend)]
    if not ours:
        raise ConfigError(f"--django {os.environ.get('DJANGO_SETTINGS_MODULE')}: no TASKS backend is "
                          "skiplock.contrib.django.SkiplockBackend")
    return task_backends["default" if "default" in ours else ours[0]]


def _conninfo(alias: str) -> str:
    """A libpq key=value string for the Django database `alias`, from Django's own connection
    parameters (its OPTIONS included), keeping only what libpq knows."""
    from django.db import connections

    from skiplock.engine.store.conninfo import libpq_conninfo

    if alias not in connections.settings:
        raise ConfigError(f"TASKS OPTIONS DATABASE {alias!r}: not in DATABASES")
    return libpq_conninfo(connections[alias].get_connection_params())

"""The API role: `skiplock api`, the HTTP API under gunicorn. See api/app.py.

Import-safe: nothing here imports Flask or prometheus_client at module level, because `main()`
must point PROMETHEUS_MULTIPROC_DIR at a fresh directory before prometheus_client is imported
(it picks its storage then).
"""

from __future__ import annotations


def create_app(settings=None, **kwargs):
    """The Flask app (see api/app.py)."""
    from .app import create_app as build

    return build(settings, **kwargs)


def main(settings, *, bind: str = "0.0.0.0:8080", workers: int = 2, threads: int = 4) -> int:
    """Entry: settings -> logging -> auth check -> migrations check -> metrics dir -> gunicorn."""
    import os
    import shutil
    import tempfile

    from ..engine import logs, migrate
    from ..engine.errors import ConfigError
    from ..engine.registry import import_task_modules
    from ..engine.tracing_setup import setup_from_environment
    from ..engine.settings import ApiSettings
    from .auth import Authenticator

    settings = ApiSettings.of(settings)  # the API's variables, and no other
    logs.setup(settings.log_format, settings.log_level)
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be a positive integer")
    if threads < 1:
        raise ConfigError(f"--threads {threads}: must be a positive integer")
    Authenticator(settings.api_tokens, enabled=settings.api_auth == "enabled")  # fail closed, before serving
    # SKIPLOCK_TASKS' kinds (kinds.py): a module that fails to import stops the API here, in one line,
    # not in each gunicorn worker; the workers inherit the imported modules through the fork
    import_task_modules(settings.tasks)
    # OTEL_TRACES_EXPORTER's provider, set in the master: a bad exporter stops the API here, in one
    # line, and the forked workers inherit it (the SDK restarts its export thread after a fork)
    setup_from_environment("api")
    # a long-poll holds a request thread: one is always left for the other requests
    settings = settings.replace(api_max_waits=min(settings.api_max_waits, threads - 1))
    url = settings.require_database_url()
    waiting = migrate.pending(url, settings.db_schema)
    if waiting:
        raise ConfigError(f"database schema {settings.db_schema!r} is not migrated ({len(waiting)} pending, "
                          f"first {waiting[0].path.name}): run `skiplock migrate`")
    # fresh per run: files left by an earlier run would be summed into this one's counters
    parent = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
    try:
        metrics_dir = tempfile.mkdtemp(prefix="skiplock-api-metrics-", dir=parent)
    except OSError as exc:
        raise ConfigError(f"PROMETHEUS_MULTIPROC_DIR={parent}: cannot create a directory in it ({exc.strerror})") from None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        from .server import ApiServer, check_bind

        check_bind(bind)

        ApiServer(settings, bind=bind, workers=workers, threads=threads).run()
    except SystemExit as exc:  # gunicorn's arbiter leaves through sys.exit
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0

"""`skiplock dev`: every role in one process, for a laptop.

With no SKIPLOCK_DATABASE_URL it starts an embedded Postgres (the `pgserver` package, data under
.skiplock/ in the current directory), applies migrations, runs a worker on the example handlers
(plus any SKIPLOCK_TASKS modules), a scheduler (with a demo schedule), a webhook dispatcher
(receivers on 127.0.0.0/8 allowed) and the HTTP API without auth on 127.0.0.1:SKIPLOCK_DEV_API_PORT
(8080), prints what to run in a second terminal (the `export` of this database and of the webhook
networks, so the `skiplock` command there acts on what this process runs), enqueues a small demo
workload and prints progress until Ctrl-C.
Not for production: one process, one embedded server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import threading
from pathlib import Path

from .engine import logs
from .engine.errors import ConfigError
from .engine.settings import Settings

log = logging.getLogger("skiplock.dev")

DEMO_KINDS = ("demo.hello", "demo.report", "demo.flaky", "demo.refund", "demo.order")


@contextlib.contextmanager
def runtime_dir(path: Path):
    """XDG_RUNTIME_DIR set to `path` (made private to this user) while pgserver is imported, if the
    environment sets none. pgserver puts its lock file in platformdirs' user runtime directory,
    chosen at import; with the variable unset (a container, root, an ssh session without a login
    manager) platformdirs prints a RuntimeDirWarning into dev's banner and falls back to a directory
    of its own. The lock guards the data directory, so it can live next to it."""
    if os.environ.get("XDG_RUNTIME_DIR") or sys.platform in ("darwin", "win32"):  # these ignore it
        yield
        return
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)  # the XDG spec's mode, which platformdirs checks
    saved = os.environ.get("XDG_RUNTIME_DIR")  # unset, or empty
    os.environ["XDG_RUNTIME_DIR"] = str(path)
    try:
        yield
    finally:  # not for the processes dev starts
        if saved is None:
            del os.environ["XDG_RUNTIME_DIR"]
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved


def embedded_postgres(data_dir: Path) -> str:
    try:
        with runtime_dir(data_dir.parent / "run"):
            import pgserver
    except ImportError:
        raise ConfigError("SKIPLOCK_DATABASE_URL: unset and the embedded Postgres is not installed; "
                          "pip install 'skiplock[dev]' or point SKIPLOCK_DATABASE_URL at a server") from None
    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data_dir, cleanup_mode="stop")
    return server.get_uri()


def enqueue_demo(url: str, schema: str) -> int:
    from .enqueueing import enqueue, enqueue_many

    ids = enqueue_many(url, "demo.hello", [{"name": f"user-{i}"} for i in range(20)], schema=schema)
    ids += [enqueue(url, "demo.report", {"pages": 5}, schema=schema) for _ in range(3)]
    ids += enqueue_many(url, "demo.flaky", [{}] * 10, schema=schema)
    ids.append(enqueue(url, "demo.refund", {"order": 7}, schema=schema))  # fails for good
    ids.append(enqueue(url, "demo.hello", {"name": "later"}, delay=10, schema=schema))
    ids += [enqueue(url, "demo.order", {"order": n}, schema=schema) for n in (1, 2)]
    return len(ids)


def apply_demo_schedule(store) -> None:
    from .engine.schedule_actions import apply_schedules
    from .engine.schedules import Schedule

    apply_schedules(store, [Schedule(name="demo.every-15s", kind="demo.hello", payload={"name": "schedule"},
                                    interval_seconds=15)])


class ApiThread:
    """The HTTP API (api/app.py) on 127.0.0.1, in a daemon thread of this process: werkzeug's
    threaded server instead of gunicorn, auth disabled (it logs the warning) — so only this
    machine can reach it."""

    def __init__(self, settings: Settings, port: int):
        from werkzeug.serving import make_server

        from .api import create_app
        from .api.console.session import with_run_key
        from .engine.metrics import listen_failure

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log line per request
        # bound here, not by werkzeug: on a taken port it prints two lines and exits the process
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with listener:
            try:
                listener.bind(("127.0.0.1", port))
                listener.listen(128)
            except OSError as exc:
                raise ConfigError(f"SKIPLOCK_DEV_API_PORT={port}: {listen_failure('127.0.0.1', port, exc)}; "
                                  "pick another port (0: any free one)") from None
            self.app = create_app(with_run_key(settings.replace(api_auth="disabled")), pool_size=4)
            self._server = make_server("127.0.0.1", port, self.app, threaded=True, fd=listener.fileno())
        self.port = self._server.port
        self._thread = threading.Thread(target=self._server.serve_forever, name="api-http", daemon=True)

    def start(self) -> "ApiThread":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever() to return: only if it runs
            self._server.shutdown()
        self._server.server_close()
        self._close_app()

    def _close_app(self) -> None:
        from .api.app import close_app

        close_app(self.app)


def this_command() -> str:
    """How another terminal runs this `skiplock`: by name when it is the one on PATH, else by its
    full path (`make dev` runs .venv/bin/skiplock, which a new terminal's PATH does not hold)."""
    script = Path(sys.executable).with_name("skiplock")
    found = shutil.which("skiplock")
    if not script.exists() or (found is not None and Path(found).resolve() == script.resolve()):
        return "skiplock"
    return shlex.quote(str(script.absolute()))


def second_terminal(settings: Settings, api_port: int) -> str:
    """What to paste into another terminal: the environment that points the `skiplock` command at
    this database with the webhook networks dev's dispatcher allows (so `skiplock webhooks add`
    accepts a receiver on this machine, as dev delivers to it), and two commands to try."""
    env = {"SKIPLOCK_DATABASE_URL": settings.database_url,
           "SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": ",".join(settings.webhook_allowed_networks)}
    if settings.db_schema != Settings.db_schema:
        env["SKIPLOCK_DB_SCHEMA"] = settings.db_schema
    payload = json.dumps({"name": "you"})
    commands = (
        "export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items()),
        f"{this_command()} enqueue demo.hello --payload {shlex.quote(payload)}",
        f"curl {shlex.quote(f'http://127.0.0.1:{api_port}/v1/tasks?kind=demo.hello&limit=5')}",
    )
    return "[skiplock dev] in another terminal:\n" + "".join(f"    {c}\n" for c in commands)


def progress(store, stop: threading.Event, deliveries=dict, every: float = 1.0) -> None:
    """A line of task counts whenever they change; once webhooks are sent, also the attempts'
    outcomes (`deliveries()`), which the dispatcher logs one by one only at DEBUG here."""
    last = None
    while not stop.wait(every):
        try:
            with store.connection() as conn:
                rows = conn.execute(f"SELECT state, count(*) FROM {store.schema}.tasks GROUP BY state").fetchall()
        except Exception as exc:  # the progress line is cosmetic; the worker logs real trouble
            line = f"(progress unavailable: {str(exc).strip()[:80]})"
        else:
            counts = dict(rows)
            line = " · ".join(f"{state} {counts.get(state, 0)}" for state in
                              ("queued", "running", "completed", "failed", "cancelled"))
        sent = deliveries()
        if any(sent.values()):
            line += (f" · webhooks delivered {sent['delivered']}, retried {sent['retry']}, "
                     f"dead {sent['dead'] + sent['gone']}")
        if line != last:
            print(f"[skiplock dev] {line}", flush=True)
            last = line


def main(settings: Settings, demo: bool = True) -> int:
    from .engine import migrate
    from .engine.registry import import_task_modules
    from .engine.lifecycle import Stop, install_signal_handlers
    from .engine.metrics import Metrics, MetricsServer
    from .engine.store import Store
    from .dispatcher.dispatcher import Dispatcher
    from .scheduler.scheduler import Scheduler
    from .worker.worker import Worker

    logs.setup("text" if sys.stdout.isatty() else settings.log_format, settings.log_level)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    url = settings.database_url
    if not url:
        data_dir = Path(".skiplock") / "pgdata"
        print(f"[skiplock dev] starting embedded Postgres in {data_dir}/ ...", flush=True)
        url = embedded_postgres(data_dir.resolve())
    settings = settings.replace(database_url=url, tasks=("skiplock.examples.demo", *settings.tasks))
    if not settings.webhook_allowed_networks:
        # on a laptop, webhook receivers usually run on this machine
        settings = settings.replace(webhook_allowed_networks=("127.0.0.0/8", "::1/128"))
    for m in migrate.apply(url, settings.db_schema):
        print(f"[skiplock dev] applied migration {m.path.name}", flush=True)
    import_task_modules(settings.tasks)

    stop = Stop()
    install_signal_handlers(stop)
    metrics = Metrics()
    with contextlib.ExitStack() as cleanup:
        # both ports first: a taken one stops dev with its reason before anything runs
        api = ApiThread(settings, settings.dev_api_port)
        cleanup.callback(api.stop)
        # ready() asks the worker built below; the server answers nobody before start()
        server = MetricsServer(metrics, settings.metrics_port, lambda: worker.ready(), host="127.0.0.1")
        store = Store.pooled(url, settings.db_schema, min_size=2, max_size=settings.concurrency + 4, name="dev",
                      worker_connections=True).open()
        cleanup.callback(store.close)
        worker = Worker(settings, store, metrics=metrics, stop=stop)
        scheduler = Scheduler(settings, store, metrics=metrics, stop=stop)
        threading.Thread(target=scheduler.run, name="scheduler", daemon=True).start()
        dispatcher = Dispatcher(settings, store, metrics=metrics, stop=stop, log_attempts=False)
        threading.Thread(target=dispatcher.run, name="dispatcher", daemon=True).start()
        server.start()
        cleanup.callback(server.stop)
        api.start()
        print(f"[skiplock dev] database {url}", flush=True)
        print(f"[skiplock dev] metrics  http://127.0.0.1:{server.port}/metrics", flush=True)
        print(f"[skiplock dev] api      http://127.0.0.1:{api.port}/v1/ (no auth; "
              f"document at /v1/openapi.json)", flush=True)
        print(f"[skiplock dev] console  http://127.0.0.1:{api.port}/ui/ (no auth)", flush=True)
        print(second_terminal(settings, api.port), end="", flush=True)
        if demo:
            apply_demo_schedule(store)
            print("[skiplock dev] schedule demo.every-15s fires demo.hello every 15 s", flush=True)
            print(f"[skiplock dev] enqueued {enqueue_demo(url, settings.db_schema)} demo tasks "
                  f"({', '.join(DEMO_KINDS)}); Ctrl-C to stop", flush=True)
        done = threading.Event()
        cleanup.callback(done.set)
        threading.Thread(target=progress, args=(store, done, dispatcher.outcomes), name="progress",
                         daemon=True).start()
        return worker.run()

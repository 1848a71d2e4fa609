"""Forward-only schema migrations: skiplock/migrations/NNNN_name.sql (package data) applied in
order, each in its own transaction, recorded in <schema>.schema_migrations, serialized across
concurrent migrators by a session advisory lock (two pods running `skiplock migrate` at once take
turns; the second finds nothing pending).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import re
import time
from pathlib import Path

import psycopg

from .errors import ConfigError, DatabaseUnavailable, MigrationError
from . import queries
from .queries import qualify
from .store import connect
from .store.database import tasks_distributed
from .store.limits import NOT_DISTRIBUTED

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Arbitrary constant shared by every skiplock migrator; combined with the schema name.
_LOCK_CLASS = 0x5C1F

log = logging.getLogger("skiplock.migrate")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path

    @property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def migrations_dir() -> Path:
    """SKIPLOCK_MIGRATIONS_DIR if set, else the copy shipped inside the package (a wheel, an image
    and the source tree all carry it: the repository's migrations/ is a link to it)."""
    configured = os.environ.get("SKIPLOCK_MIGRATIONS_DIR")
    if configured:
        if not Path(configured).is_dir():
            raise MigrationError(f"SKIPLOCK_MIGRATIONS_DIR: {configured} is not a directory")
        return Path(configured)
    shipped = Path(__file__).resolve().parent.parent / "migrations"
    if not shipped.is_dir():
        raise MigrationError(f"no migrations directory at {shipped} (an install without its package "
                             "data?); set SKIPLOCK_MIGRATIONS_DIR")
    return shipped


def discover(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _FILE_RE.fullmatch(path.name)
        if match:
            found.append(Migration(match.group(1), match.group(2), path))
        elif path.suffix == ".sql":
            raise MigrationError(f"{path.name}: migration files are named NNNN_snake_case.sql")
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {directory}")
    return found


def _applied(conn: psycopg.Connection, schema: str) -> dict[str, str]:
    exists = conn.execute("SELECT to_regclass(%s)", (f"{schema}.schema_migrations",)).fetchone()[0]
    if exists is None:
        return {}
    rows = conn.execute(f"SELECT version, checksum FROM {schema}.schema_migrations").fetchall()
    return dict(rows)


def pending(url: str, schema: str = "skiplock") -> list[Migration]:
    """Migrations not yet applied. Raises MigrationError if an applied file was changed."""
    available = discover()
    with connect(url) as conn:
        applied = _applied(conn, schema)
    _check_unchanged(available, applied)
    return [m for m in available if m.version not in applied]


def slots_exhausted(exc: BaseException) -> bool:
    """Postgres refused a connection because max_connections is reached (SQLSTATE 53300: "too
    many clients already", or "remaining connection slots are reserved" for superusers)."""
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    if getattr(cause, "sqlstate", None) == "53300":
        return True
    # a refused connection has no result, so no SQLSTATE: Postgres's words are all there is
    return any(words in str(exc) for words in _SLOTS_EXHAUSTED)


_SLOTS_EXHAUSTED = ("too many clients already", "remaining connection slots are reserved")


def require_current(url: str, schema: str = "skiplock") -> None:
    """What every role checks before it starts: refuse a database with pending migrations.

    A database without a free connection slot is waited for, with backoff and one log line: the
    pods an autoscaler adds meet that first, and exiting would only add a crash loop to the
    shortage. Any other connection failure is raised (a wrong URL fails the start at once)."""
    failures = 0
    while True:
        try:
            waiting = pending(url, schema)
            break
        except DatabaseUnavailable as exc:
            if not slots_exhausted(exc):
                raise
            if not failures:
                log.warning("Postgres has no free connection slot (max_connections reached); waiting for one "
                            "before starting", extra={"error": " ".join(str(exc).split())[:300]})
            failures += 1
            time.sleep(random.uniform(0.5, min(10.0, 0.5 * 2**failures)))
    if waiting:
        raise ConfigError(f"database schema {schema!r} is not migrated ({len(waiting)} pending, "
                          f"first {waiting[0].path.name}): run `skiplock migrate`")


def _check_unchanged(available: list[Migration], applied: dict[str, str]) -> None:
    for m in available:
        if m.version in applied and applied[m.version] != m.checksum:
            raise MigrationError(
                f"migration {m.path.name} was changed after it was applied; migrations are "
                "forward-only: add a new file instead"
            )


def apply(url: str, schema: str = "skiplock") -> list[Migration]:
    """Apply every pending migration; returns those this call applied."""
    available = discover()
    done: list[Migration] = []
    with connect(url) as conn:
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_LOCK_CLASS, schema))
        try:
            with conn.transaction():
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {schema}.schema_migrations ("
                    " version text PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
            # read under the lock: whoever held it before us may have applied some
            applied = _applied(conn, schema)
            _check_unchanged(available, applied)
            for m in available:
                if m.version in applied:
                    continue
                try:
                    with conn.transaction():
                        conn.execute(qualify(m.sql, schema))
                        conn.execute(
                            f"INSERT INTO {schema}.schema_migrations (version, name, checksum)"
                            " VALUES (%s, %s, %s)",
                            (m.version, m.name, m.checksum),
                        )
                except psycopg.Error as exc:
                    raise MigrationError(f"migration {m.path.name} failed: {exc}".strip()) from exc
                done.append(m)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LOCK_CLASS, schema))
    return done

# -- the distributed placement on Citus: where the tables live (`skiplock migrate --distributed`)
# On one Postgres every table is local (on a Citus coordinator too); distributed, what grows with
# the work is spread over the worker nodes by queue. The placement is the database's own fact
# (Citus's catalog says whether `tasks` is distributed), read by the store when it opens
# (Database.distributed), so every process agrees with the schema it finds. Applying it runs
# engine/sql/placement.sql's statements after the migrations, under the migrators' lock;
# applying it again does nothing.

# small, read by routed statements (a claim reads the pauses and limits), written rarely: a copy on
# every node. Their writes are two-phase commits across the nodes.
_REFERENCE_TABLES = ("pauses", "limits", "limit_groups", "queue_kinds", "schedules", "schedule_fires", "workers",
                    "webhook_endpoints", "signals", "audit_log", "console_sessions_ended",
                    "console_token_sign_outs", "auth_failures")
_KEY_CHANGES = ("placement_drop_triggers", "placement_dependency_keys", "placement_task_keys",
                "placement_functions")
# distributed by queue next to their tasks, each with the rest of its primary key
_COLOCATED_KEYS = {"task_events": "task_id, seq", "task_steps": "task_id, position"}


def distribute(url: str, schema: str = "skiplock") -> bool:
    """Apply the distributed placement to a migrated schema; False when it was applied before.
    Raises MigrationError, in one line, on a database without Citus or a step Citus refuses."""
    sql = queries.load(schema)
    with connect(url) as conn:
        if not conn.execute(sql["placement_citus_installed"]).fetchone()[0]:
            raise MigrationError("--distributed needs the citus extension in this database: CREATE EXTENSION citus "
                                 "here and on every worker node, and add the nodes (citus_add_node), first")
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_LOCK_CLASS, schema))
        try:
            if tasks_distributed(conn, sql):
                return False
            [(limited,)] = conn.execute(sql["placement_limits_set"]).fetchall()
            if limited:
                raise MigrationError(f"{NOT_DISTRIBUTED}; delete the limits first (skiplock limits delete "
                                     f"{limited[0]}{', ...' if len(limited) > 1 else ''})")
            step = "placement_keys_changed"
            try:
                if not conn.execute(sql[step]).fetchone()[0]:
                    with conn.transaction():
                        for step in _KEY_CHANGES:
                            conn.execute(sql[step])
                        step = "placement_queue_column"
                        for table, key in _COLOCATED_KEYS.items():
                            conn.execute(sql[step].format(table=table, key=key))
                # each table once: a placement cut off halfway is resumed where it stopped
                for step, tables in (("placement_reference_tables", _REFERENCE_TABLES),
                                     ("placement_distribute_tasks", ("tasks",)),
                                     ("placement_distribute_colocated", tuple(_COLOCATED_KEYS)),
                                     ("placement_distribute_dependencies", ("task_dependencies",))):
                    for table in tables:
                        name = {"table": f"{schema}.{table}"}
                        if not conn.execute(sql["placement_table_distributed"], name).fetchone()[0]:
                            conn.execute(sql[step], name)
            except psycopg.Error as exc:
                raise MigrationError(f"the distributed placement failed at {step}: "
                                     f"{' '.join(str(exc).split())}") from exc
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LOCK_CLASS, schema))
    return True

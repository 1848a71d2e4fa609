"""The wheel carries its migrations, the web console's pages and assets, and the Django backend: built from the source,
installed into a fresh venv that cannot see the repository, its `skiplock migrate` applies every
migration from a directory outside it."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import psycopg

from tests.image.packaging import build_wheel, install, run
from tests.support.harness import ROOT

MIGRATIONS = sorted(p.name for p in (ROOT / "services" / "skiplock" / "migrations").glob("*.sql"))


def test_an_installed_wheel_migrates_a_database_from_outside_the_repository(db_url, tmp_path, request):
    # kept between runs by pytest's cache, where that plugin is on
    cache_plugin = getattr(request.config, "cache", None)
    cache = cache_plugin.mkdir("skiplock-dependency-wheels") if cache_plugin else tmp_path / "wheels"
    wheel = build_wheel(tmp_path, cache)
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(n.rpartition("/")[2] for n in archive.namelist() if n.startswith("skiplock/migrations/"))
    assert shipped == MIGRATIONS and len(shipped) >= 9
    console = ROOT / "services" / "skiplock" / "api" / "console"
    assets = sorted(str(p.relative_to(console)) for folder in ("templates", "static")
                    for p in (console / folder).glob("*.*"))
    with zipfile.ZipFile(wheel) as archive:
        assert {f"skiplock/api/console/{a}" for a in assets} <= set(archive.namelist()), "console pages and assets"
    assert "static/console.js" in assets and "templates/base.html" in assets
    with zipfile.ZipFile(wheel) as archive:  # Django's task backend and its management command (tests/django)
        assert {"skiplock/contrib/django/backend.py",
                "skiplock/contrib/django/management/commands/skiplock_worker.py"} <= set(archive.namelist())

    bin_dir = install(wheel, tmp_path / "venv", cache)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "PYTHON"))}
    # a schema of its own in the test's database: migrated from nothing by the installed wheel
    env.update(SKIPLOCK_DATABASE_URL=db_url, SKIPLOCK_DB_SCHEMA="from_wheel", SKIPLOCK_METRICS_PORT="0")
    where = run([bin_dir / "python", "-c", "import skiplock; print(skiplock.__file__)"],
                cwd=outside, env=env, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout
    done = run([bin_dir / "skiplock", "migrate"], cwd=outside, env=env, timeout=120)
    assert done.stdout.splitlines()[-1] == f"{len(MIGRATIONS)} migration(s) applied", done.stdout
    with psycopg.connect(db_url) as conn:
        applied = conn.execute("SELECT version || '_' || name || '.sql' FROM from_wheel.schema_migrations"
                               " ORDER BY version").fetchall()
    assert [name for (name,) in applied] == MIGRATIONS

"""docker/Dockerfile built and run for real (podman, as root): the image prints its version,
migrates a database, and runs a worker as UID 10001 on a read-only root filesystem that completes
a task and exits 0 on SIGTERM after draining the one it holds.

Size bound: the image may hold at most MAX_ADDED_BYTES on top of its base. What skiplock adds is
its venv (skiplock and its dependencies' wheels installed and compiled, about 55 MB) and a user; the
bound leaves room for dependencies to grow and fails on what a mistake adds: a compiler toolchain,
a wheel cache or the source tree, each 100 MB or more. The base is not skiplock's to bound (the
production python:3.11-slim-bookworm or, where it cannot be pulled, Debian's own Python 3.11).
"""

from __future__ import annotations

import os
import shutil
import time
import tomllib

import psycopg
import pytest

import skiplock
from tests.image.podman import Podman
from tests.support.harness import ROOT, free_port, http_status, wait_for

MAX_ADDED_BYTES = 80_000_000
MIGRATIONS = sorted(p.name for p in (ROOT / "services" / "skiplock" / "migrations").glob("*.sql"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
GRACE_SECONDS = 10


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    assert shutil.which("podman"), "podman is missing: scripts/install-test-tools installs it"
    engine = Podman(tmp_path_factory.mktemp("podman"))
    reason = engine.unusable()
    if reason:
        pytest.skip(reason)
    return engine


@pytest.fixture(scope="module")
def image(podman):
    """The image, built once for this module from the checkout; removed afterwards."""
    base = podman.base_image()
    reason = podman.unusable(base)
    if reason:
        pytest.skip(reason)
    tag = f"localhost/skiplock-test:{os.getpid()}"
    seconds = podman.build(base, tag)
    size, base_size = podman.size(tag), podman.size(base)
    yield {"tag": tag, "base": base, "size": size, "added": size - base_size, "seconds": seconds}
    podman("rmi", "--force", tag, check=False)


@pytest.fixture
def container(podman):
    """Names for containers of this test; each is removed afterwards, whatever happened."""
    names: list[str] = []

    def name(role: str) -> str:
        names.append(f"skiplock-test-{role}-{os.getpid()}-{len(names)}")
        return names[-1]

    yield name
    for n in names:
        podman("rm", "--force", "--time", "0", n, check=False)


def _run(podman, image, *args, env: dict | None = None, options=()):
    flags = [flag for k, v in (env or {}).items() for flag in ("--env", f"{k}={v}")]
    return podman("run", "--rm", "--network", "host", *options, *flags, image["tag"], *args, timeout=120)


def test_the_image_stays_within_its_size_bound(image, record_property):
    print(f"image built on {image['base']} in {image['seconds']:.0f} s: {image['size'] / 1e6:.0f} MB, "
          f"{image['added'] / 1e6:.0f} MB on top of its base")
    record_property("image_bytes", image["size"])
    record_property("image_bytes_added_to_base", image["added"])
    assert 0 < image["added"] <= MAX_ADDED_BYTES, (
        f"the image adds {image['added'] / 1e6:.0f} MB to its base, past the {MAX_ADDED_BYTES / 1e6:.0f} MB bound")


def test_the_image_prints_its_version_and_migrates_a_database(podman, image, db_url):
    assert _run(podman, image, "--version").stdout == f"skiplock {VERSION}\n"
    env = {"SKIPLOCK_DATABASE_URL": db_url, "SKIPLOCK_DB_SCHEMA": "from_image"}
    done = _run(podman, image, "migrate", env=env, options=("--read-only", "--tmpfs", "/tmp"))
    assert done.stdout.splitlines()[-1] == f"{len(MIGRATIONS)} migration(s) applied", done.stdout
    with psycopg.connect(db_url) as conn:
        count = conn.execute("SELECT count(*) FROM from_image.schema_migrations").fetchone()[0]
    assert count == len(MIGRATIONS)
    again = _run(podman, image, "migrate", "--check", env=env)
    assert again.stdout == "up to date\n"


def test_a_read_only_worker_as_uid_10001_completes_a_task_and_drains_on_sigterm(podman, image, db_url, container):
    port = free_port()
    name = container("worker")
    handlers = ROOT / "tests" / "support" / "handlers.py"
    podman("run", "--detach", "--name", name, "--network", "host", "--user", "10001:10001",
           "--read-only", "--tmpfs", "/tmp", "--volume", f"{handlers}:/opt/app/test_handlers.py:ro",
           "--env", "PYTHONPATH=/opt/app", "--env", "SKIPLOCK_TASKS=test_handlers",
           "--env", f"SKIPLOCK_DATABASE_URL={db_url}", "--env", f"SKIPLOCK_METRICS_PORT={port}",
           "--env", f"SKIPLOCK_SHUTDOWN_GRACE_SECONDS={GRACE_SECONDS}", image["tag"], "worker")

    def ready():
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert state == "running", f"worker container {state}:\n{_logs(podman, name)}"
        try:
            return http_status(port, "/readyz") == 200
        except OSError:
            return False

    wait_for(ready, timeout=60, message="the worker container ready")
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"

    quick = skiplock.enqueue(db_url, "t.record", {"sleep": 0})
    with psycopg.connect(db_url, autocommit=True) as db:
        wait_for(lambda: _state(db, quick) == "completed", timeout=30, message="the task completed")
        assert _result(db, quick) == {"slept": 0.0}

        # a task in the worker's hands when SIGTERM comes: drained, then exit 0
        held = skiplock.enqueue(db_url, "t.record", {"sleep": 2})
        wait_for(lambda: _state(db, held) == "running", timeout=30, message="the second task running")
        stopping = time.monotonic()
        podman("kill", "--signal", "TERM", name)
        code = podman("wait", name, timeout=GRACE_SECONDS + 30).stdout.strip()
        assert (code, time.monotonic() - stopping < GRACE_SECONDS) == ("0", True), _logs(podman, name)
        assert _state(db, held) == "completed" and _result(db, held) == {"slept": 2.0}
        executions = db.execute("SELECT count(*) FROM public.executions WHERE task_id IN (%s, %s)",
                                (quick, held)).fetchone()[0]
        assert executions == 2


def _state(db, task_id) -> str:
    return db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]


def _result(db, task_id):
    return db.execute("SELECT result FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]


def _logs(podman, name: str) -> str:
    return podman("logs", name, check=False).stdout[-3000:]

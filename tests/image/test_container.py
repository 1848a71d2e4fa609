"""docker/Dockerfile built and run for real (podman, as root): the image prints its version,
migrates a database, and runs a worker as UID 10001 on a read-only root filesystem that completes
a task, keeps its pod's deletion cost, and exits 0 on SIGTERM after draining the one it holds. The
image is built and pushed by the README's own lines, to a registry of the test's own.

Size bound: the image may hold at most MAX_ADDED_BYTES on top of its base. What skiplock adds is
its venv (skiplock and its dependencies' wheels installed and compiled, about 95 MB, 41 MB of it the
kubernetes client the worker's pod deletion cost uses) and a user; the bound leaves room for dependencies to grow and fails on what a mistake adds: a compiler toolchain,
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
from tests.image.podman import Podman, Registry
from tests.support import kube_api
from tests.support.harness import ROOT, free_port, http_status, wait_for
from tests.support.readme import deploy_argv

MAX_ADDED_BYTES = 120_000_000
MIGRATIONS = sorted(p.name for p in (ROOT / "services" / "skiplock" / "migrations").glob("*.sql"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
GRACE_SECONDS = 10


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    assert shutil.which("docker-registry"), "docker-registry is missing: scripts/install-test-tools installs it"
    server = Registry(tmp_path_factory.mktemp("registry"), free_port())
    try:
        wait_for(lambda: _answers(server), timeout=30, message="the registry answering")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def podman(tmp_path_factory, registry):
    assert shutil.which("podman"), "podman is missing: scripts/install-test-tools installs it"
    engine = Podman(tmp_path_factory.mktemp("podman"), insecure_registry=registry.address)
    reason = engine.unusable()
    if reason:
        pytest.skip(reason)
    return engine


@pytest.fixture(scope="module")
def image(podman, registry):
    """The image, built and pushed once for this module by the README's own build and push lines,
    from the checkout, to a registry of the test's own; removed afterwards. Under xdist one worker
    runs the whole module (tests/support/parallel.py ONE_WORKER_MODULES)."""
    base = podman.base_image()
    reason = podman.unusable(base)
    if reason:
        pytest.skip(reason)
    variables = {"REGISTRY": f"{registry.address}/team"}
    build = deploy_argv("podman build", variables)
    tag = build[build.index("-t") + 1]
    try:
        seconds = podman.build(base, build)
        podman.argv(deploy_argv("podman push", variables), timeout=300)
        size, base_size = podman.size(tag), podman.size(base)
        yield {"tag": tag, "base": base, "size": size, "added": size - base_size, "seconds": seconds}
    finally:
        podman("rmi", "--force", tag, check=False)


def _answers(registry) -> bool:
    try:
        return registry.get("/v2/") == {}
    except OSError:
        return False


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


def test_the_readme_pushes_the_image_the_chart_names(image, registry):
    """The README's push put the tag the chart's appVersion names into the registry."""
    assert image["tag"].rsplit(":", 1)[1] == VERSION
    assert registry.get("/v2/team/skiplock/tags/list") == {"name": "team/skiplock", "tags": [VERSION]}


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


@pytest.fixture
def kube(tmp_path):
    api = kube_api.KubeApi().start()
    yield api, api.kubeconfig(tmp_path)
    api.stop()


def test_a_read_only_worker_as_uid_10001_completes_a_task_and_drains_on_sigterm(podman, image, db_url, container,
                                                                               kube):
    """Also: the image carries the kubernetes client, so the worker keeps its pod's deletion cost
    (here against a stand-in API server) as the chart's worker.podDeletionCost asks."""
    port = free_port()
    name = container("worker")
    handlers = ROOT / "tests" / "support" / "handlers.py"
    api, kubeconfig = kube
    os.chmod(kubeconfig, 0o644)  # readable by UID 10001
    podman("run", "--detach", "--name", name, "--network", "host", "--user", "10001:10001",
           "--read-only", "--tmpfs", "/tmp", "--volume", f"{handlers}:/opt/app/test_handlers.py:ro",
           "--volume", f"{kubeconfig}:/etc/skiplock/kubeconfig:ro", "--env", "KUBECONFIG=/etc/skiplock/kubeconfig",
           "--env", "SKIPLOCK_POD_DELETION_COST=true", "--env", "SKIPLOCK_POD_DELETION_COST_SECONDS=0.5",
           "--env", "SKIPLOCK_POD_NAME=skiplock-worker-7d9f-x2x", "--env", "SKIPLOCK_POD_NAMESPACE=jobs",
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
        wait_for(lambda: api.costs()[-1:] == ["1"], timeout=10, message="the pod's deletion cost at 1")
        stopping = time.monotonic()
        podman("kill", "--signal", "TERM", name)
        code = podman("wait", name, timeout=GRACE_SECONDS + 30).stdout.strip()
        assert (code, time.monotonic() - stopping < GRACE_SECONDS) == ("0", True), _logs(podman, name)
        assert _state(db, held) == "completed" and _result(db, held) == {"slept": 2.0}
        executions = db.execute("SELECT count(*) FROM public.executions WHERE task_id IN (%s, %s)",
                                (quick, held)).fetchone()[0]
        assert executions == 2
    patches = api.seen()
    assert {(p.method, p.path) for p in patches} == {("PATCH", "/api/v1/namespaces/jobs/pods/skiplock-worker-7d9f-x2x")}
    assert "1" in [p.cost for p in patches] and all(p.cost in ("0", "1") for p in patches), patches


def _state(db, task_id) -> str:
    return db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]


def _result(db, task_id):
    return db.execute("SELECT result FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]


def _logs(podman, name: str) -> str:
    return podman("logs", name, check=False).stdout[-3000:]

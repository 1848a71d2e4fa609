"""A real `skiplock worker` process with SKIPLOCK_POD_DELETION_COST on, pointed by KUBECONFIG at a
stand-in Kubernetes API server on 127.0.0.1: it keeps its pod's deletion cost near its in-flight
count, and an API server that refuses or hangs never holds up task work or shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import skiplock
from tests.support import harness
from tests.support.harness import metric, scalar, wait_exit, wait_for
from tests.support.kube_api import TOKEN, KubeApi

NAMESPACE, POD = "jobs", "skiplock-worker-5d9c7b-x2k4q"
TASKS = "tests.support.handlers,tests.support.gated"
FAILED_LINE = "pod deletion cost update failed"


@pytest.fixture
def kube(request):
    api = KubeApi(getattr(request, "param", "ok")).start()
    yield api
    api.stop()


def _spawn(processes, db_url, kube, tmp_path, interval: float):
    return processes.spawn(db_url, "--concurrency", "4", tasks=TASKS, env={
        "SKIPLOCK_POD_DELETION_COST": "true", "SKIPLOCK_POD_NAME": POD, "SKIPLOCK_POD_NAMESPACE": NAMESPACE,
        "SKIPLOCK_POD_DELETION_COST_SECONDS": str(interval), "KUBECONFIG": str(kube.kubeconfig(tmp_path)),
    })


def _completed(db) -> int:
    return scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")


def _updates(port: int, outcome: str) -> float | None:
    return metric(port, "skiplock_pod_deletion_cost_updates_total", outcome=outcome)


def _holds(condition, seconds: float, message: str) -> None:
    """Fail as soon as `condition()` turns false within `seconds` (to show that nothing happens)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert condition(), message
        time.sleep(0.05)


def _log_lines(proc, text: str) -> list[dict]:
    return [json.loads(line) for line in proc.log().splitlines() if text in line]


def test_the_annotation_follows_the_in_flight_count_on_change_at_most_once_per_interval(
        db_url, db, processes, kube, tmp_path):
    interval = 1.0
    worker = _spawn(processes, db_url, kube, tmp_path, interval)
    processes.wait_ready(worker)
    # the first write clears whatever a previous container of this pod left
    wait_for(lambda: kube.costs() == ["0"], 15, message="the first patch, to 0")

    gate = tmp_path / "release"
    skiplock.enqueue_many(db_url, "t.gated", [{"gate": str(gate)}] * 3)
    wait_for(lambda: kube.costs() == ["0", "3"], 15, message="a patch to 3 while 3 tasks are held")
    assert metric(worker.metrics_port, "skiplock_worker_inflight") == 3
    _holds(lambda: len(kube.seen()) == 2, 3 * interval, "an unchanged in-flight count was patched again")

    gate.touch()
    wait_for(lambda: _completed(db) == 3, 15, message="3 completed tasks")
    wait_for(lambda: kube.costs() == ["0", "3", "0"], 15, message="a patch to 0 once they finished")
    _holds(lambda: len(kube.seen()) == 3, 3 * interval, "an unchanged in-flight count was patched again")

    requests = kube.seen()
    assert [(r.method, r.path, r.content_type, r.authorization) for r in requests] == [
        ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}", "application/strategic-merge-patch+json",
         f"Bearer {TOKEN}")] * 3
    assert [r.json() for r in requests] == [
        {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": v}}} for v in ("0", "3", "0")]
    # each change came right after the previous patch, so each waited out the interval (less the
    # jitter of two requests' way to the server)
    gaps = [b.at - a.at for a, b in zip(requests, requests[1:])]
    assert min(gaps) >= interval - 0.05, gaps
    assert _updates(worker.metrics_port, "ok") == 3
    assert _updates(worker.metrics_port, "error") == 0

    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, 30)[0] == 0
    assert len(kube.seen()) == 3  # shutting down writes nothing


@pytest.mark.parametrize("kube", ["forbidden"], indirect=True)
def test_a_forbidden_patch_is_counted_and_logged_in_one_line_and_tasks_still_complete(
        db_url, db, processes, kube, tmp_path):
    worker = _spawn(processes, db_url, kube, tmp_path, 0.5)
    processes.wait_ready(worker)
    skiplock.enqueue_many(db_url, "t.record", [{"sleep": 0.01}] * 10)
    wait_for(lambda: _completed(db) == 10, 30, message="10 completed tasks")
    assert harness.state_counts(db) == {"completed": 10}

    # retried every interval, logged once a minute
    wait_for(lambda: (_updates(worker.metrics_port, "error") or 0) >= 3, 15, message="3 failed patches")
    assert _updates(worker.metrics_port, "ok") == 0
    assert len(kube.seen()) >= 3
    (line,) = _log_lines(worker, FAILED_LINE)
    assert line["level"] == "warning" and line["pod"] == f"{NAMESPACE}/{POD}"
    assert line["error"].startswith(f'HTTP 403 Forbidden: pods "{POD}" is forbidden')
    assert "exc" not in line and "Traceback" not in worker.log()
    assert harness.http_status(worker.metrics_port, "/readyz") == 200


@pytest.mark.parametrize("kube", ["hang"], indirect=True)
def test_a_hanging_api_server_holds_up_neither_tasks_nor_shutdown(db_url, db, processes, kube, tmp_path):
    worker = _spawn(processes, db_url, kube, tmp_path, 0.5)
    processes.wait_ready(worker)
    wait_for(lambda: kube.open_hangs == 1, 15, message="a patch left hanging")

    skiplock.enqueue_many(db_url, "t.record", [{"sleep": 0.01}] * 10)
    wait_for(lambda: _completed(db) == 10, 30, message="10 completed tasks")
    # they ran while the patch was still waiting for its answer
    assert kube.open_hangs == 1 and len(kube.seen()) == 1
    assert _updates(worker.metrics_port, "error") == 0

    # the request times out, is counted, and the next one is sent
    wait_for(lambda: _updates(worker.metrics_port, "error") == 1, 15, message="the patch to time out")
    (line,) = _log_lines(worker, FAILED_LINE)
    assert line["error"].startswith("ReadTimeoutError:") and "timed out" in line["error"]
    wait_for(lambda: kube.open_hangs == 1 and len(kube.seen()) == 2, 15, message="a second patch left hanging")

    worker.signal(signal.SIGTERM)
    code, _ = wait_exit(worker, 30)
    assert code == 0
    assert harness.state_counts(db) == {"completed": 10}
    assert "Traceback" not in worker.log()


def _run_worker(db_url, changes: dict, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "KUBECONFIG"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.update({
        "SKIPLOCK_DATABASE_URL": db_url,
        "SKIPLOCK_TASKS": "tests.support.handlers",
        "SKIPLOCK_METRICS_PORT": str(harness.free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, (extra_path, str(harness.ROOT), os.environ.get("PYTHONPATH")))),
        "SKIPLOCK_POD_DELETION_COST": "true", "SKIPLOCK_POD_NAME": POD, "SKIPLOCK_POD_NAMESPACE": NAMESPACE,
    })
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run([sys.executable, "-m", "skiplock.cli", "worker"], env=env, cwd=harness.ROOT,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _one_line_exit_1(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("skiplock worker: ")
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


def test_on_without_a_pod_name_exits_1_naming_the_variable(db_url):
    line = _one_line_exit_1(_run_worker(db_url, {"SKIPLOCK_POD_NAME": None}))
    assert "SKIPLOCK_POD_NAME: required when SKIPLOCK_POD_DELETION_COST is true" in line


def test_on_outside_a_cluster_without_kubeconfig_exits_1(db_url):
    line = _one_line_exit_1(_run_worker(db_url, {}))
    assert "SKIPLOCK_POD_DELETION_COST=true: no in-cluster Kubernetes configuration" in line


def test_on_without_the_kubernetes_package_says_what_to_install(db_url, tmp_path):
    # a `kubernetes` that cannot be imported, first on the path, as if it were not installed
    shadow = tmp_path / "kubernetes"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'kubernetes'\", "
                                        "name='kubernetes')\n")
    line = _one_line_exit_1(_run_worker(db_url, {}, extra_path=str(tmp_path)))
    assert "pip install 'skiplock[kubernetes]'" in line

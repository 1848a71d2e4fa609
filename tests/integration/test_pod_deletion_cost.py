"""The pod deletion cost writer, one `run_once()` at a time: the real `kubernetes` client, loaded from
a kubeconfig, talking HTTP to a stand-in API server on 127.0.0.1. The clock is the test's, so the
interval is checked without waiting for it."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest
import urllib3.exceptions

from skiplock.engine.errors import ConfigError
from skiplock.engine.metrics import Metrics
from skiplock.worker.pod_cost import ANNOTATION, PodApi, PodDeletionCost
from tests.support.harness import ROOT, metric
from tests.support.kube_api import TOKEN, KubeApi, write_kubeconfig

NAMESPACE, POD = "jobs", "skiplock-worker-5d9c7b-x2k4q"


@pytest.fixture
def kube(request, tmp_path, monkeypatch):
    """A stand-in API server (mode from @pytest.mark.parametrize indirect, default 'ok'), with
    KUBECONFIG pointing at it."""
    api = KubeApi(getattr(request, "param", "ok")).start()
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
    yield api
    api.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _writer(inflight: list[int], clock: Clock, metrics: Metrics, interval: float = 5.0,
            timeout: float = 3.0) -> PodDeletionCost:
    return PodDeletionCost(PodApi(NAMESPACE, POD, timeout=timeout), lambda: inflight[0], metrics, interval,
                           clock=clock)


def _counts(metrics: Metrics) -> tuple[float | None, float | None]:
    samples = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            samples[f"{s.name}{{{labels}}}"] = s.value
    return (metric(samples, "skiplock_pod_deletion_cost_updates_total", outcome="ok"),
            metric(samples, "skiplock_pod_deletion_cost_updates_total", outcome="error"))


def test_the_request_is_one_strategic_merge_patch_of_the_annotation_with_the_kubeconfig_token(kube):
    inflight, metrics = [3], Metrics()
    assert _writer(inflight, Clock(), metrics).run_once() == "written"

    (request,) = kube.seen()
    assert request.method == "PATCH"
    assert request.path == f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
    assert request.content_type == "application/strategic-merge-patch+json"
    assert request.authorization == f"Bearer {TOKEN}"
    assert request.json() == {"metadata": {"annotations": {ANNOTATION: "3"}}}
    assert _counts(metrics) == (1, 0)


def test_writes_only_a_changed_value_and_at_most_once_per_interval(kube):
    inflight, clock, metrics = [0], Clock(), Metrics()
    writer = _writer(inflight, clock, metrics, interval=5.0)

    assert writer.run_once() == "written"           # the first write: a restarted worker's old value goes
    clock.now += 10
    assert writer.run_once() == "unchanged"         # nothing changed: nothing sent, however long ago
    inflight[0] = 4
    assert writer.run_once() == "written"           # a change after a quiet spell goes at once
    inflight[0] = 7
    clock.now += 1
    assert writer.run_once() == "waiting"           # too soon after the last write
    inflight[0] = 5
    clock.now += 3.9
    assert writer.run_once() == "waiting"
    clock.now += 0.1
    assert writer.run_once() == "written"           # the interval has passed: the latest value, not 7
    inflight[0] = 6
    clock.now += 1
    assert writer.run_once() == "waiting"
    inflight[0] = 5                                 # back to what the annotation says before it was due
    clock.now += 10
    assert writer.run_once() == "unchanged"

    assert kube.costs() == ["0", "4", "5"]
    assert _counts(metrics) == (3, 0)


def test_the_value_is_an_int32_string(kube):
    inflight, clock = [2**40], Clock()
    writer = _writer(inflight, clock, Metrics())
    assert writer.run_once() == "written"
    assert kube.costs() == [str(2**31 - 1)]


@pytest.mark.parametrize("kube", ["forbidden"], indirect=True)
def test_forbidden_is_counted_logged_once_a_minute_and_retried_each_interval(kube, caplog):
    caplog.set_level(logging.INFO, logger="skiplock.worker.pod_cost")
    inflight, clock, metrics = [0], Clock(), Metrics()
    writer = _writer(inflight, clock, metrics, interval=5.0)

    outcomes = []
    for _ in range(4):  # 0 s, 5 s, 10 s, 15 s: the value never changes, but the annotation is unknown
        outcomes.append(writer.run_once())
        clock.now += 1
        outcomes.append(writer.run_once())
        clock.now += 4
    assert outcomes == ["failed", "waiting"] * 4
    assert kube.costs() == ["0"] * 4
    assert _counts(metrics) == (0, 4)

    lines = [r for r in caplog.records if r.name == "skiplock.worker.pod_cost"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert lines[0].error.startswith(f'HTTP 403 Forbidden: pods "{POD}" is forbidden')
    assert lines[0].pod == f"{NAMESPACE}/{POD}"

    clock.now += 60  # a minute after the last line: one more, with the failures it stood for
    assert writer.run_once() == "failed"
    lines = [r for r in caplog.records if r.name == "skiplock.worker.pod_cost"]
    assert len(lines) == 2 and lines[1].failures == 4

    kube.mode = "ok"
    clock.now += 5
    assert writer.run_once() == "written"
    lines = [r for r in caplog.records if r.name == "skiplock.worker.pod_cost"]
    assert len(lines) == 3 and lines[2].getMessage() == "pod deletion cost updates recovered"
    assert lines[2].failures == 5
    assert _counts(metrics) == (1, 5)


@pytest.mark.parametrize("kube", ["not_found"], indirect=True)
def test_not_found_names_the_pod(kube, caplog):
    caplog.set_level(logging.WARNING, logger="skiplock.worker.pod_cost")
    writer = _writer([1], Clock(), Metrics())
    assert writer.run_once() == "failed"
    (line,) = caplog.records
    assert line.error == f'HTTP 404 Not Found: pods "{POD}" not found'


@pytest.mark.parametrize("kube", ["hang"], indirect=True)
def test_a_hanging_api_server_times_out_and_the_next_change_is_written_after_it(kube, caplog):
    caplog.set_level(logging.WARNING, logger="skiplock.worker.pod_cost")
    inflight, clock, metrics = [2], Clock(), Metrics()
    writer = _writer(inflight, clock, metrics, timeout=0.5)

    assert writer.run_once() == "failed"
    assert _counts(metrics) == (0, 1)
    (line,) = caplog.records
    # our line: the transport error's class and its first line; the class is urllib3's (the
    # client's transport) timeout, whatever name and words a release gives it
    name, _, text = line.error.partition(": ")
    error_class = getattr(urllib3.exceptions, name, None)
    assert isinstance(error_class, type) and issubclass(error_class, urllib3.exceptions.TimeoutError), line.error
    assert text and "\n" not in text, line.error

    # the timed-out patch may have been applied: a later write of the same value is not skipped
    kube.mode = "ok"
    clock.now += 5
    assert writer.run_once() == "written"
    assert kube.costs() == ["2", "2"]


def test_connection_refused_is_a_failure_not_an_exception(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="skiplock.worker.pod_cost")
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, f"http://127.0.0.1:{bound.getsockname()[1]}")))
        metrics = Metrics()
        assert _writer([1], Clock(), metrics).run_once() == "failed"
    assert _counts(metrics) == (0, 1)
    (line,) = caplog.records
    assert "Connection refused" in line.error


def test_configuration_errors_are_one_line_config_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"^KUBECONFIG=.*missing: cannot load it") as err:
        PodApi(NAMESPACE, POD)
    assert "\n" not in str(err.value)

    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match=r"^SKIPLOCK_POD_DELETION_COST=true: no in-cluster") as err:
        PodApi(NAMESPACE, POD)
    assert "\n" not in str(err.value)


def test_a_worker_with_the_feature_off_never_imports_the_kubernetes_client():
    code = ("import sys\n"
            "from skiplock.engine.settings import Settings\n"
            "from skiplock.worker.worker import Worker\n"
            "worker = Worker(Settings(), store=None)\n"
            "assert worker.pod_cost is None\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

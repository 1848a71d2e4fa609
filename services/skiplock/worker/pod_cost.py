"""Pod deletion cost: keeps this worker's pod annotation `controller.kubernetes.io/pod-deletion-cost`
near the worker's in-flight count, so that when a ReplicaSet scales in it deletes the idlest
workers first (a lower cost goes first; a pod without the annotation counts as 0).

Near, not equal: the annotation is written only when the value changes, and at most once per
interval (SKIPLOCK_POD_DELETION_COST_SECONDS). A burst of claims and outcomes becomes one patch
carrying the latest count, and a steady worker writes nothing.

It runs in a thread of its own: an API call may take up to its timeout and must never delay a
claim, a heartbeat or an outcome. Its failures are counted and logged, at most one line a minute,
and never stop task work. It must not write on shutdown (the pod is going away), nor import the
`kubernetes` package unless the feature is on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from ..engine.errors import ConfigError

log = logging.getLogger("skiplock.worker.pod_cost")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
REQUEST_TIMEOUT_SECONDS = 3.0
LOG_EVERY_SECONDS = 60.0
_INT32_MAX = 2**31 - 1  # the annotation must parse as an int32


class PodApi:
    """This pod, through the real `kubernetes` client: in-cluster configuration, or the file
    KUBECONFIG names when it is set. Raises ConfigError (one line) when neither can be loaded."""

    def __init__(self, namespace: str, name: str, timeout: float = REQUEST_TIMEOUT_SECONDS):
        try:
            from kubernetes import client, config
        except ImportError:
            raise ConfigError("SKIPLOCK_POD_DELETION_COST=true needs the Kubernetes client: "
                              "pip install 'skiplock[kubernetes]'") from None
        self.namespace, self.name, self.timeout = namespace, name, timeout
        configuration = client.Configuration()
        kubeconfig = os.environ.get("KUBECONFIG")
        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except Exception as exc:  # noqa: BLE001 - the loaders raise ConfigException, OSError, YAML errors
            if kubeconfig:
                raise ConfigError(f"KUBECONFIG={kubeconfig}: cannot load it ({_first_line(exc)})") from None
            raise ConfigError(f"SKIPLOCK_POD_DELETION_COST=true: no in-cluster Kubernetes configuration "
                              f"({_first_line(exc)}); run in a pod with a service account token, or set "
                              "KUBECONFIG") from None
        configuration.retries = False  # one request per attempt: the next interval is the retry
        self._pods = client.CoreV1Api(client.ApiClient(configuration))
        self._api_exception = client.ApiException

    def patch_deletion_cost(self, value: int) -> None:
        """One PATCH of the annotation; raises on any failure (HTTP status, timeout, connection)."""
        response = self._pods.patch_namespaced_pod(
            self.name, self.namespace, {"metadata": {"annotations": {ANNOTATION: str(value)}}},
            # the client sends a dict body as a strategic merge patch (its REST layer's rule; the
            # releases below 36 accept no content type of ours), which the tests check
            # a (connect, read) pair: a lone float is silently ignored by some client releases
            _request_timeout=(self.timeout, self.timeout),
            # the reply is the whole pod: read it, but build no objects from it
            _preload_content=False)
        try:
            response.read()
        finally:
            response.release_conn()

    def describe(self, exc: BaseException) -> str:
        """One line for the log: the status and the API server's own message, or the transport error."""
        if isinstance(exc, self._api_exception):
            message = _status_message(exc.body)
            return f"HTTP {exc.status} {exc.reason}" + (f": {message}" if message else "")
        return f"{type(exc).__name__}: {_first_line(exc)}"


class PodDeletionCost:
    """Owns what was written and when; `run_once()` decides and writes, `start()` loops it."""

    def __init__(self, api: PodApi, inflight: Callable[[], int], metrics, interval: float,
                 clock: Callable[[], float] = time.monotonic):
        self.api, self.interval, self._inflight, self._clock = api, interval, inflight, clock
        self.pod = f"{api.namespace}/{api.name}"
        self._written: int | None = None        # the annotation's value as far as we know; None: unknown
        self._attempted_at: float | None = None
        self._failures = 0                      # in a row
        self._unlogged = 0                      # failures since the last line logged
        self._logged_at: float | None = None
        counter = metrics.pod_deletion_cost_updates
        self._ok, self._error = counter.labels("ok"), counter.labels("error")

    @classmethod
    def from_settings(cls, settings, inflight: Callable[[], int], metrics) -> "PodDeletionCost":
        return cls(PodApi(settings.pod_namespace, settings.pod_name), inflight, metrics,
                   settings.pod_deletion_cost_seconds)

    def run_once(self) -> str:
        """Write the in-flight count if it differs from the annotation and the interval since the
        last attempt has passed. Returns 'written', 'failed', 'unchanged' or 'waiting'."""
        value = max(0, min(int(self._inflight()), _INT32_MAX))
        if value == self._written:
            return "unchanged"
        now = self._clock()
        if self._attempted_at is not None and now - self._attempted_at < self.interval:
            return "waiting"
        self._attempted_at = now
        try:
            self.api.patch_deletion_cost(value)
        except Exception as exc:  # noqa: BLE001 - nothing here may stop task work
            # a timed-out patch may still have been applied: the annotation is unknown until written again
            self._written = None
            self._error.inc()
            self._failed(exc, now)
            return "failed"
        self._written = value
        self._ok.inc()
        if self._failures:
            log.info("pod deletion cost updates recovered", extra={"pod": self.pod, "failures": self._failures})
            self._failures = self._unlogged = 0
            self._logged_at = None
        return "written"

    def _failed(self, exc: BaseException, now: float) -> None:
        self._failures += 1
        self._unlogged += 1
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY_SECONDS:
            return
        log.warning("pod deletion cost update failed; task work goes on",
                    extra={"pod": self.pod, "error": self.api.describe(exc)[:300], "failures": self._unlogged})
        self._logged_at, self._unlogged = now, 0

    def run(self, stop: threading.Event) -> None:
        # look often, write rarely: a change after a quiet spell is written within a tick
        tick = min(0.5, self.interval)
        while not stop.wait(tick):
            self.run_once()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="pod-cost", daemon=True)
        thread.start()
        return thread


def _status_message(body) -> str:
    """The `message` of a Kubernetes Status reply, if the body is one."""
    try:
        message = json.loads(body).get("message")
    except (TypeError, ValueError, AttributeError):
        return ""
    return _first_line(message) if isinstance(message, str) else ""


def _first_line(value) -> str:
    lines = str(value).strip().splitlines()
    return lines[0] if lines else type(value).__name__

"""Runs a rendered pod's containers as local processes: the container's command, args and env,
its mounted Secrets and ConfigMaps written to temporary directories (mount paths translated), the
database URL replaced by the test database's, the downward API's pod name and namespace filled in,
a mounted service account token replaced by a kubeconfig naming a local address, and every container
port moved to a free local port. Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.chart.rendering import NAMESPACE
from tests.support.harness import free_port, wait_for

VENV_BIN = Path(sys.executable).parent


@dataclass
class LocalContainer:
    name: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int]                 # container port name -> local port
    probes: dict[str, tuple[int, str]]    # probe kind -> (local port, path)
    termination_grace: int
    log_path: Path
    popen: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "LocalContainer":
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=self.log_path.parent, start_new_session=True)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def probe(self, kind: str) -> int | None:
        port, path = self.probes[kind]
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3).status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def wait_ready(self, timeout: float = 30) -> None:
        def ready():
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.popen.returncode}) before ready:\n{self.log()[-3000:]}")
            return self.probe("startupProbe") == 200 and self.probe("readinessProbe") == 200
        wait_for(ready, timeout, interval=0.1, message=f"{self.name} ready")

    def run_to_end(self, timeout: float) -> int:
        self.start()
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout}s:\n{self.log()[-3000:]}") from None

    def terminate(self) -> tuple[int, float]:
        """SIGTERM, as the kubelet sends it; returns (exit code, seconds to exit)."""
        started = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        try:
            code = self.popen.wait(self.termination_grace)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} outlived terminationGracePeriodSeconds "
                                 f"({self.termination_grace}s):\n{self.log()[-3000:]}") from None
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(10)


def _secret_data(objs: list[dict], name: str, provided: dict[str, dict[str, str]]) -> dict[str, str]:
    for o in objs:
        if o["kind"] == "Secret" and o["metadata"]["name"] == name:
            return {k: base64.b64decode(v).decode() for k, v in o.get("data", {}).items()}
    assert name in provided, f"Secret {name} is neither rendered nor provided by the test"
    return provided[name]


def _configmap_data(objs: list[dict], name: str) -> dict[str, str]:
    for o in objs:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name:
            return dict(o["data"])
    raise AssertionError(f"ConfigMap {name} is mounted but not rendered")


def localize(objs: list[dict], owner: dict, container: dict, workdir: Path, *, db_url: str,
             database_secret: str, provided_secrets: dict[str, dict[str, str]] | None = None,
             termination_grace: int | None = None, kube_api_server: str | None = None) -> LocalContainer:
    """The container of `owner` (a Deployment, Job or Pod) as a local process, not started.
    A pod that mounts its service account token reaches the Kubernetes API at `kube_api_server`
    through a kubeconfig (default: a free local port nothing serves, so every call fails fast)."""
    provided = dict(provided_secrets or {})
    spec = owner["spec"] if owner["kind"] == "Pod" else owner["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    root = workdir / f"{owner['metadata']['name']}-{container['name']}"
    root.mkdir(parents=True, exist_ok=True)

    # mounts: Secrets and ConfigMaps written out; the database Secret's URL is the test database's
    mounts: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        local = root / ("vol-" + mount["name"])
        local.mkdir(exist_ok=True)
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            data = _secret_data(objs, name, provided) if name != database_secret else None
            for item in volume["secret"].get("items") or [{"key": k, "path": k} for k in (data or {})]:
                if name == database_secret:
                    value = db_url  # the one substitution: the database URL
                else:
                    value = data[item["key"]]
                (local / item["path"]).write_text(value)
        elif "configMap" in volume:
            data = _configmap_data(objs, volume["configMap"]["name"])
            for key, value in data.items():
                (local / key).write_text(value)
        else:
            assert "emptyDir" in volume, f"unexpected volume {volume}"
        mounts[mount["mountPath"]] = str(local)

    # one pass, so a translated path (under the test's /tmp) is never translated again
    pattern = re.compile(r"(?<![\w/.-])(" + "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
                         + r")(?=/|\s|$)") if mounts else None

    def translate(text: str) -> str:
        return pattern.sub(lambda m: mounts[m.group(1)], text) if pattern else text

    # ports: each container port moves to a free local one; env values and args follow
    ports: dict[str, int] = {}
    number_to_local: dict[int, int] = {}
    for p in container.get("ports", []):
        ports[p["name"]] = number_to_local[p["containerPort"]] = free_port()

    def move_ports(text: str) -> str:
        for number, local in number_to_local.items():
            if text == str(number):
                return str(local)
            if text == f"0.0.0.0:{number}":
                return f"127.0.0.1:{local}"
        return text

    env = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
           "TMPDIR": mounts.get("/tmp", str(root)), "LANG": "C.UTF-8"}
    # the downward API as the kubelet fills it in for a pod of this owner
    downward = {"metadata.name": f"{owner['metadata']['name']}-local",
                "metadata.namespace": owner["metadata"].get("namespace", NAMESPACE)}
    for e in container.get("env", []):
        if "valueFrom" in e:
            path = e["valueFrom"].get("fieldRef", {}).get("fieldPath")
            assert path in downward, f"{container['name']}: {e['name']} comes from {e['valueFrom']}"
            env[e["name"]] = downward[path]
        else:
            env[e["name"]] = move_ports(translate(e["value"]))
    if spec.get("automountServiceAccountToken") is not False:
        server = kube_api_server or f"http://127.0.0.1:{free_port()}"
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(json.dumps({  # JSON is YAML
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "local", "cluster": {"server": server}}],
            "users": [{"name": "pod", "user": {"token": "service-account-token"}}],
            "contexts": [{"name": "pod", "context": {"cluster": "local", "user": "pod"}}]}))
        env["KUBECONFIG"] = str(kubeconfig)
    argv = [move_ports(translate(a)) for a in container.get("command", []) + container.get("args", [])]
    assert argv, f"{container['name']}: no command"

    probes = {}
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        if kind in container:
            get = container[kind]["httpGet"]
            port = ports[get["port"]] if isinstance(get["port"], str) else number_to_local[get["port"]]
            probes[kind] = (port, get["path"])
    grace = termination_grace if termination_grace is not None else spec.get("terminationGracePeriodSeconds", 30)
    return LocalContainer(name=f"{owner['kind']}/{owner['metadata']['name']}/{container['name']}", argv=argv,
                          env=env, ports=ports, probes=probes, termination_grace=grace,
                          log_path=root / "output.log")

"""A real Prometheus server for tests: Debian's `prometheus` binary with its own configuration,
its own TSDB directory and a free port on 127.0.0.1, queried through its HTTP API.

It scrapes only the targets a test names and evaluates only the rule files it is given; it must
never reach past 127.0.0.0/8.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.support.harness import free_port, wait_for


def binary() -> str:
    path = shutil.which("prometheus")
    assert path, "the prometheus server is missing: `make test` installs it (scripts/install-test-tools)"
    return path


class PrometheusServer:
    """`scrape_configs` and rule `groups` as Prometheus reads them; every interval is `interval`."""

    def __init__(self, workdir: Path, scrape_configs: list[dict], rule_groups: list[dict] | None = None,
                 interval: str = "1s"):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config: dict = {"global": {"scrape_interval": interval, "scrape_timeout": interval,
                                   "evaluation_interval": interval},
                        "scrape_configs": scrape_configs}
        if rule_groups:
            rules = workdir / "rules.yaml"
            rules.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
            config["rule_files"] = [str(rules)]
        self.config_path = workdir / "prometheus.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> "PrometheusServer":
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(
                [binary(), f"--config.file={self.config_path}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True)

        def ready():
            if self.popen.poll() is not None:
                raise AssertionError(f"prometheus exited ({self.popen.returncode}):\n{self.log()[-3000:]}")
            try:
                return urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for(ready, timeout, interval=0.1, message="prometheus ready")
        return self

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def api(self, path: str, **params) -> dict | list:
        """GET /api/v1/<path>; the `data` of a successful answer, else AssertionError with the error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """The instant vector of `expr` now: [{'metric': {...}, 'value': [t, 'v']}, ...]; a scalar
        or string result is returned as one sample without labels."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def targets(self) -> list[dict]:
        return self.api("targets", state="active")["activeTargets"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

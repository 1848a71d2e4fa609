"""Building and running docker/Dockerfile with podman, as root, on a machine without Docker.

What a host without a Docker engine needs, found the hard way:
- runc as the runtime (crun refuses the cgroup setup of some hosts), cgroupfs as the cgroup
  manager and a file as the events log (no systemd), and low default nofile/nproc limits
  (podman's, a million and more, exceed what a host that is itself a container may grant): a
  containers.conf of the test's own, through CONTAINERS_CONF, so the host's setup is untouched;
- pip in the build reaches the host's package index the way the host does: the host's CA bundle
  and a pip.conf made from the host's index settings are mounted into every build step;
- --network host, so builds reach the index and containers reach the test Postgres on 127.0.0.1;
- a registry to push to: Debian's docker-registry on 127.0.0.1, which a registries.conf of the
  test's own (CONTAINERS_REGISTRIES_CONF) marks as plain HTTP;
- a base image: python:3.11-slim-bookworm (the production default) when it can be pulled, else
  Debian's own Python 3.11 made with mmdebstrap --variant=minbase and imported, cached in
  podman's store under a tag naming its recipe.
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tests.image.packaging import run
from tests.support.harness import ROOT, child_environment

PRODUCTION_BASE = "docker.io/library/python:3.11-slim-bookworm"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile={nofile[0]}:{nofile[1]}", "nproc={nproc[0]}:{nproc[1]}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
# Debian's Python 3.11, pip and venv (the Dockerfile's build stage runs `pip wheel` and
# `python -m venv`; its runtime stage runs groupadd/useradd, from passwd). merged-usr by a hook,
# not by the usrmerge package, which would pull in perl; no docs, man pages or translations.
DEBIAN_BASE_RECIPE = (
    "mmdebstrap", "--variant=minbase",
    "--include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "bookworm",
)
DEBIAN_MIRROR = "http://deb.debian.org/debian"


class Podman:
    """podman with the test's containers.conf; every call runs through here."""

    def __init__(self, workdir: Path, insecure_registry: str):
        self.workdir = workdir
        conf = workdir / "containers.conf"
        conf.write_text(CONTAINERS_CONF.format(nofile=_at_most(resource.RLIMIT_NOFILE, 4096),
                                               nproc=_at_most(resource.RLIMIT_NPROC, 4096)))
        registries = workdir / "registries.conf"
        registries.write_text(f'[[registry]]\nlocation = "{insecure_registry}"\ninsecure = true\n')
        self.env = {**child_environment(), "CONTAINERS_CONF": str(conf), "CONTAINERS_REGISTRIES_CONF": str(registries)}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return self.argv(["podman", *args], timeout=timeout, check=check)

    def argv(self, argv: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """A podman command line as given (the README's own, say), run from the repository root."""
        assert argv[0] == "podman", argv
        argv = [str(a) for a in argv]
        if check:
            return run(argv, timeout=timeout, env=self.env, cwd=ROOT)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=ROOT)

    def unusable(self, base: str | None = None) -> str | None:
        """Why containers cannot run here, in one line; None when they can. With `base`, tries
        running a container of it."""
        if os.geteuid() != 0:
            return "podman runs the image test as root only (rootless podman needs subuid ranges)"
        probe = ("run", "--rm", "--network", "host", base, "true") if base else ("info",)
        done = self(*probe, check=False, timeout=120)
        if done.returncode != 0:
            return "podman cannot run a container here: " + (done.stderr.strip().splitlines() or ["?"])[-1]
        return None

    def size(self, image: str) -> int:
        return int(self("image", "inspect", "--format", "{{.Size}}", image).stdout)

    def base_image(self) -> str:
        """The image to build on: the production base if present or pullable, else the Debian one."""
        if self("image", "exists", PRODUCTION_BASE, check=False).returncode == 0:
            return PRODUCTION_BASE
        if self("pull", "--quiet", PRODUCTION_BASE, check=False, timeout=300).returncode == 0:
            return PRODUCTION_BASE
        recipe = " ".join((*DEBIAN_BASE_RECIPE, DEBIAN_MIRROR))
        tag = f"localhost/skiplock-test-base:bookworm-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
        if self("image", "exists", tag, check=False).returncode != 0:
            tarball = self.workdir / "base.tar"
            run([*DEBIAN_BASE_RECIPE, tarball, DEBIAN_MIRROR], timeout=600, stdin=subprocess.DEVNULL)
            self("import", "--quiet", tarball, tag, timeout=300)
            tarball.unlink()
        return tag

    def build(self, base: str, argv: list[str]) -> float:
        """Runs a `podman build` command line (the README's) from the repository root, with what
        this host needs added after `build`: the base, the network and pip's settings. Returns the
        seconds it took."""
        assert argv[:2] == ["podman", "build"], argv
        mounts = ["--volume", f"{self._pip_conf()}:/etc/pip.conf:ro"]
        if HOST_CA_BUNDLE.is_file():
            mounts += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
        started = time.monotonic()
        # --layers=false: no intermediate images left behind in the store
        self.argv([*argv[:2], "--quiet", "--layers=false", "--network", "host", *mounts,
                   "--build-arg", f"PYTHON_IMAGE={base}", *argv[2:]], timeout=900)
        return time.monotonic() - started

    def _pip_conf(self) -> Path:
        """The host's index settings for pip in the build. Local directories (file:// indexes,
        find-links) are left out: the build cannot see them, and pip falls back to PyPI."""
        lines = ["[global]"]
        if HOST_CA_BUNDLE.is_file():
            # the image's own bundle may lack a CA the host's network needs (a re-signing proxy)
            lines.append(f"cert = {HOST_CA_BUNDLE}")
        host = _host_pip_settings()
        for key in ("index-url", "extra-index-url", "trusted-host", "proxy"):
            values = [v for v in host.get(key, []) if not v.startswith("file:")]
            if key == "proxy" and not values:
                values = [v for v in (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"),) if v]
            if values:
                lines.append(f"{key} = {' '.join(values)}")
        path = self.workdir / "pip.conf"
        path.write_text("\n".join(lines) + "\n")
        return path


def _at_most(limit: int, most: int) -> tuple[int, int]:
    """(soft, hard) of `limit` for a container: `most` (plenty for one role), or less where the
    test process itself may not exceed that."""
    hard = resource.getrlimit(limit)[1]
    value = most if hard == resource.RLIM_INFINITY else min(most, hard)
    return value, value


def _host_pip_settings() -> dict[str, list[str]]:
    """Every value pip on this host has for each setting, from its config files and PIP_* variables
    ('global.index-url', ':env:.index-url' -> 'index-url')."""
    shown = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                           text=True, timeout=60).stdout
    settings: dict[str, list[str]] = {}
    for line in shown.splitlines():
        name, _, value = line.partition("=")
        values = settings.setdefault(name.rpartition(".")[2], [])
        values += [v for v in value.strip().strip("'\"").split() if v not in values]
    return settings


class Registry:
    """Debian's docker-registry (the distribution registry) on 127.0.0.1, storing in `workdir`."""

    def __init__(self, workdir: Path, port: int):
        self.address = f"127.0.0.1:{port}"
        config = workdir / "registry.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
                          f"http:\n  addr: {self.address}\nlog:\n  level: error\n")
        self.log = workdir / "registry.log"
        self._process = subprocess.Popen(["docker-registry", "serve", str(config)],
                                         stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def get(self, path: str):
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)

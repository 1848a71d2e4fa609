"""Building and installing skiplock the way it ships, without the network once warm.

The wheel is built from a clean copy of the files a build reads (what the image's build stage
copies), so the checkout gets no build/ or egg-info and concurrent runs share nothing. It is built
by the suite's own setuptools (the lock's `build` group), as the image builds it, without build
isolation. Runtime dependencies are the lock's (requirements/image.txt, with hashes) and come as
wheels from a cache directory: pip fills it with the host's own index configuration when something
is missing, and every later run installs with `--no-index`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.harness import ROOT

# what docker/Dockerfile's build stage copies; a wheel built from these alone is what users get
BUILD_INPUTS = ("pyproject.toml", "README.md", "services")
PIP = (sys.executable, "-m", "pip")
# what the image's venv holds, pinned with hashes (scripts/lock exports it from uv.lock)
IMAGE_REQUIREMENTS = ROOT / "requirements" / "image.txt"


def run(argv, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Runs argv; a failure shows its output in the assertion."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{list(argv)[:5]} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _offline(argv, cache: Path, fill) -> None:
    """argv with pip's index off and `cache` as the only source; on a miss, `fill` the cache and
    run argv again (the second failure is the test's)."""
    argv = [*argv, "--no-index", "--find-links", cache]
    if subprocess.run([str(a) for a in argv], capture_output=True, timeout=300).returncode != 0:
        run([*PIP, *fill, "--quiet", "--dest" if fill[0] == "download" else "--wheel-dir", cache],
            timeout=300)
        run(argv, timeout=300)


def build_wheel(workdir: Path, cache: Path) -> Path:
    """The skiplock wheel, without its dependencies, in workdir/dist."""
    source = workdir / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = workdir / "dist"
    run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", dist, source],
        timeout=300)
    (wheel,) = dist.glob("skiplock-*.whl")
    return wheel


def install(wheel: Path, venv: Path, cache: Path) -> Path:
    """A new venv (without pip, which it does not need) holding `wheel` and its dependencies, and
    nothing of the checkout; returns its bin directory."""
    run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=60)
    target = (*PIP, "--python", venv / "bin" / "python", "install", "--quiet", "--no-deps")
    _offline([*target, "--require-hashes", "-r", IMAGE_REQUIREMENTS], cache,
             fill=["download", "--require-hashes", "--no-deps", "-r", IMAGE_REQUIREMENTS])
    run([*target, wheel], timeout=120)
    return venv / "bin"

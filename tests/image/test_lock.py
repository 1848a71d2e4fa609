"""The lock works from nothing: a new venv made from uv.lock alone, with no cache (every package
downloaded and checked against the lock's hashes), runs every role's entry point from the
checkout's code. A package that a role imports but the lock does not hold fails here, whatever
this machine has installed elsewhere.

The package itself is not installed (no build): the roles are imported from services/, so this
checks the dependencies, and tests/image/test_wheel.py checks the wheel.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.image.packaging import run
from tests.support.harness import ROOT

UV = Path(sys.executable).with_name("uv")
# each role's entry module and the CLI: importing one imports what that role runs with
ROLES = ("skiplock.worker", "skiplock.scheduler", "skiplock.dispatcher", "skiplock.api",
         "skiplock.api.server", "skiplock.api.gunicorn_classes", "skiplock.worker.pod_cost",
         "skiplock.cli")


def test_a_venv_from_the_lock_alone_imports_every_role(tmp_path, capsys):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "PYTHON", "UV_", "VIRTUAL_ENV"))}
    env.update(UV_PROJECT_ENVIRONMENT=str(venv), UV_PYTHON_DOWNLOADS="never", UV_NO_CACHE="1")
    started = time.monotonic()
    # what the image installs: the package's dependencies and the kubernetes extra
    run([UV, "sync", "--frozen", "--no-cache", "--no-install-project", "--no-default-groups",
         "--extra", "kubernetes", "--python", sys.executable, "--quiet"], cwd=ROOT, env=env, timeout=600)
    took = time.monotonic() - started
    with capsys.disabled():
        print(f"\nvenv from uv.lock alone, no cache: {took:.1f} s")

    env.update(PYTHONPATH=str(ROOT / "services"))
    script = ("import importlib, sys\n"
              f"for name in {ROLES!r}:\n"
              "    importlib.import_module(name)\n"
              "print(len([m for m in sys.modules if m.startswith('skiplock')]))\n")
    done = run([venv / "bin" / "python", "-c", script], cwd=tmp_path, env=env, timeout=120)
    assert int(done.stdout.strip()) > 20, done.stdout
    # nothing of the test extras came along: the venv is the lock's runtime set, not this one
    listed = run([UV, "pip", "list", "--python", venv / "bin" / "python", "--format", "freeze"],
                 cwd=tmp_path, env=env, timeout=60).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert {"flask", "gunicorn", "psycopg", "httpx", "kubernetes"} <= names, names
    assert not names & {"pytest", "hypothesis", "cronsim", "django"}, names
    help_text = run([venv / "bin" / "python", "-c", "from skiplock.cli import main; main(['--help'])"],
                    cwd=tmp_path, env=env, timeout=60).stdout
    for role in ("worker", "scheduler", "dispatcher", "api", "migrate"):
        assert role in help_text


def _lock_checkout(tmp_path: Path) -> Path:
    """The files scripts/lock reads, copied: a checkout to break without touching this one."""
    import shutil

    copy = tmp_path / "checkout"
    (copy / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy2(ROOT / name, copy / name)
    shutil.copytree(ROOT / "requirements", copy / "requirements")
    shutil.copy2(ROOT / "scripts" / "lock", copy / "scripts" / "lock")
    return copy


def _lock_check(copy: Path):
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    env["UV"] = str(UV)
    return subprocess.run(["sh", str(copy / "scripts" / "lock"), "check"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_lock_check_passes_on_the_checkout_and_fails_in_one_line_when_they_disagree(tmp_path):
    copy = _lock_checkout(tmp_path)
    assert _lock_check(copy).returncode == 0, _lock_check(copy).stderr

    pyproject = copy / "pyproject.toml"
    original, lock = pyproject.read_text(), (copy / "uv.lock").read_bytes()
    pyproject.write_text(original.replace('"httpx>=0.27",', '"httpx>=0.27",\n    "six>=1.16",', 1))
    added = _lock_check(copy)
    assert added.returncode == 1
    assert added.stderr.splitlines() == ["uv.lock does not match pyproject.toml: run 'make lock' and commit both"]
    assert (copy / "uv.lock").read_bytes() == lock, "the check rewrote the lock"

    pyproject.write_text(original)
    image = copy / "requirements" / "image.txt"
    image.write_text(image.read_text().replace("httpx==", "httpx===", 1))
    stale = _lock_check(copy)
    assert stale.returncode == 1
    assert stale.stderr.splitlines() == [
        "requirements/image.txt is not what uv.lock gives: run 'make lock' and commit it"]

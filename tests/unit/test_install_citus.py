"""scripts/install-citus, which `make tools` runs: with Citus installed it builds nothing; without it
and without a source directory it says in one line how to get Citus and exits 0 (the distributed
tier then skips with the same advice), never a build that fails halfway."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(tmp_path: Path, *, citus_installed: bool) -> subprocess.CompletedProcess:
    libdir = tmp_path / "lib"
    libdir.mkdir()
    if citus_installed:
        (libdir / "citus.so").write_bytes(b"")
    pg_config = tmp_path / "pg_config"
    pg_config.write_text(f"#!/bin/sh\necho {libdir}\n")
    pg_config.chmod(0o755)
    env = {**os.environ, "PG_CONFIG": str(pg_config), "SKIPLOCK_CITUS_SOURCE": str(tmp_path / "no-such-dir")}
    return subprocess.run([str(ROOT / "scripts" / "install-citus")], env=env, capture_output=True, text=True,
                          timeout=30)


def test_an_installed_citus_is_left_as_it_is(tmp_path):
    done = run_script(tmp_path, citus_installed=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"citus: installed in {tmp_path / 'lib'}"]


def test_without_citus_or_its_source_one_line_says_how_to_get_it(tmp_path):
    done = run_script(tmp_path, citus_installed=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and done.stderr == ""
    assert lines[0].startswith(f"citus: not installed and no source at {tmp_path / 'no-such-dir'}")
    assert "github.com/citusdata/citus" in lines[0] and "tests/distributed is skipped" in lines[0]

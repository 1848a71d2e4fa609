"""The suite's own environment: SKIPLOCK_* variables a developer exported reach no test and no
process a test starts (tests/conftest.py scrubs them), also under pytest-xdist, whose workers still
get SKIPLOCK_TEST_DATABASE_URL, the suite's one knob. The checks are tests/support/environment_probe.py,
run by a pytest of their own started with such variables exported."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from tests.support import environment_probe, harness


def test_exported_variables_reach_no_test_and_the_server_url_reaches_every_worker(pg_server_url):
    conninfo = psycopg.conninfo.conninfo_to_dict(pg_server_url)
    conninfo["application_name"] = "suite-environment-check"
    exported = {"SKIPLOCK_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/nowhere", "SKIPLOCK_LEASE_SECONDS": "x",
                "SKIPLOCK_DB_SCHEMA": "not_migrated", "SKIPLOCK_LOG_FORMAT": "bogus", "SKIPLOCK_RELIABILITY": "full",
                "SKIPLOCK_TEST_DATABASE_URL": psycopg.conninfo.make_conninfo(**conninfo),
                environment_probe.EXPECTED_APPLICATION: "suite-environment-check"}
    # under xdist, the harder case: the workers are processes of their own, started by the controller
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           environment_probe.__file__], cwd=harness.ROOT, env={**os.environ, **exported},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout[-4000:]

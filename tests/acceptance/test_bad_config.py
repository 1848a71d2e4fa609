"""`skiplock worker` with a bad configuration exits 1 at once with a one-line reason on stderr
that names the variable to fix, and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import harness

CASES = {
    "heartbeat_over_a_third_of_the_lease": (
        {"SKIPLOCK_LEASE_SECONDS": "6", "SKIPLOCK_HEARTBEAT_SECONDS": "2.5"}, "SKIPLOCK_HEARTBEAT_SECONDS"),
    "grace_not_below_the_lease": (
        {"SKIPLOCK_LEASE_SECONDS": "6", "SKIPLOCK_HEARTBEAT_SECONDS": "1",
         "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": "6"}, "SKIPLOCK_SHUTDOWN_GRACE_SECONDS"),
    "zero_concurrency": ({"SKIPLOCK_CONCURRENCY": "0"}, "SKIPLOCK_CONCURRENCY"),
    "negative_claim_lanes": ({"SKIPLOCK_CLAIM_LANES": "-1"}, "SKIPLOCK_CLAIM_LANES"),
    "bad_queue_name": ({"SKIPLOCK_QUEUES": "default,bad queue!"}, "SKIPLOCK_QUEUES"),
    "missing_database_url": ({"SKIPLOCK_DATABASE_URL": None}, "SKIPLOCK_DATABASE_URL"),
    "missing_task_module": ({"SKIPLOCK_TASKS": "tests.support.no_such_module"}, "SKIPLOCK_TASKS"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_exits_1_with_one_line_naming_the_variable(case, db_url):
    changes, variable = CASES[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
    env.update({
        "SKIPLOCK_DATABASE_URL": db_url,  # a migrated database: the only fault is the one under test
        "SKIPLOCK_TASKS": "tests.support.handlers",
        "SKIPLOCK_METRICS_PORT": str(harness.free_port()),
        "PYTHONPATH": str(harness.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    })
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value

    done = subprocess.run([sys.executable, "-m", "skiplock.cli", "worker"], env=env, cwd=harness.ROOT,
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)

    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert variable in lines[0], lines[0]
    assert lines[0].startswith("skiplock worker: ")
    assert "Traceback" not in done.stderr + done.stdout

"""Tests run only by tests/acceptance/test_suite_environment.py, in a pytest of their own started
with SKIPLOCK_* variables exported (this file's name keeps it out of the suite's collection)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import harness

EXPECTED_APPLICATION = "SUITE_ENVIRONMENT_EXPECTED_APPLICATION_NAME"
PRINT_SKIPLOCK_VARIABLES = "import os; print(sorted(k for k in os.environ if k.startswith('SKIPLOCK_')))"


def test_no_skiplock_variable_in_the_test_or_a_process_it_starts():
    assert [k for k in os.environ if k.startswith("SKIPLOCK_")] == []
    inherited = subprocess.run([sys.executable, "-c", PRINT_SKIPLOCK_VARIABLES], capture_output=True,
                               text=True, timeout=30, check=True)
    assert inherited.stdout.strip() == "[]"
    given = subprocess.run([sys.executable, "-c", PRINT_SKIPLOCK_VARIABLES], capture_output=True, text=True,
                           timeout=30, check=True, env=harness.child_environment(SKIPLOCK_LOG_LEVEL="INFO"))
    assert given.stdout.strip() == "['SKIPLOCK_LOG_LEVEL']"


def test_the_databases_are_on_the_server_the_run_was_given(db):
    # the run's SKIPLOCK_TEST_DATABASE_URL names an application_name: every worker's databases use it
    assert harness.scalar(db, "SELECT current_setting('application_name')") == os.environ[EXPECTED_APPLICATION]


def test_a_spawned_worker_sees_only_what_the_test_gives_it(db_url, processes):
    # an exported SKIPLOCK_LEASE_SECONDS=x would stop it at start-up; SKIPLOCK_DB_SCHEMA would point
    # it at a schema that is not migrated
    worker = processes.spawn(db_url, env={"SKIPLOCK_SHUTDOWN_GRACE_SECONDS": "1"})
    processes.wait_ready(worker)

"""SIGTERM must always stop a worker, whatever its claim loop is doing when the signal lands.

The signal handler runs on the main thread, between two bytecodes of whatever that thread was
doing; the main thread is the worker's claim loop, which spends its time in `_wake.wait()` and
`_wake.clear()`. If the handler takes a lock that the interrupted code already holds (a
threading.Event's internal lock is not reentrant), the main thread waits for itself forever and
the worker never exits: Kubernetes then SIGKILLs it and its claims wait out their leases.

The race is narrow on an idle worker; it is made likely here by a worker whose slot is full while
wake-ups keep coming (the claim loop goes round as fast as it can) and by many rounds: with
the bug, a deadlock usually comes within the first 60 rounds (about 70 fit in 20 s).
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import harness

ROUNDS_SECONDS = 20   # rounds of claim + wake-up storm + SIGTERM, as many as fit
WATCHDOG_SECONDS = 30  # a round takes well under a second; a stuck one is a deadlock


def test_sigterm_never_deadlocks_the_claim_loop(db_url):
    env = {**harness.child_environment(), "PYTHONPATH": str(harness.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "SKIPLOCK_LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability.sigterm_race_driver", db_url, str(ROUNDS_SECONDS),
         str(WATCHDOG_SECONDS)],
        env=env, cwd=harness.ROOT, capture_output=True, text=True, timeout=WATCHDOG_SECONDS + 30)
    stacks = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("{"))
    assert done.returncode == 0 and done.stdout.strip().startswith("ok"), (
        f"a SIGTERM left Worker.run() stuck (exit {done.returncode}); stacks at the watchdog:\n"
        f"{stacks[-4000:]}\nstdout: {done.stdout[-1000:]}")
    rounds = int(done.stdout.split()[-1])
    assert rounds >= 10, f"only {rounds} rounds ran: the race was hardly exercised"

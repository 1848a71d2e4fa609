"""The worker's variables (claims, leases, heartbeats, handlers) and those of a worker in a
Kubernetes pod (its pod deletion cost), with the relations between them that startup checks.

It declares; it reads no environment.
"""

from __future__ import annotations

import re

from ..errors import ConfigError
from .declaration import POD, WORKER, Bound, Variable, at_least_zero, positive
from .shared import check_name, check_url

CLAIM_LANES_MAX = 1000
# Kubernetes object names: a pod's is a DNS subdomain, a namespace's a DNS label
_POD_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

_W = ("worker", "dev")
_WORKER_AND_API = ("worker", "api", "dev")  # the API long-polls on the LISTEN URL and imports the tasks


def _queues(variable: Variable, queues) -> None:
    for q in queues:
        check_name("queue", q, variable.env)
    if not queues:
        raise ConfigError(f"{variable.env}: at least one queue is required")


VARIABLES: tuple[Variable, ...] = (
    Variable("LISTEN", True, "a worker holds a LISTEN connection and claims as soon as work is notified; `false`: "
             "it only polls, every `SKIPLOCK_POLL_SECONDS`", WORKER, _W, kind="boolean", contract=3),
    Variable("LISTEN_DATABASE_URL", None, "libpq URL of the worker's LISTEN connection, where it differs from "
             "`SKIPLOCK_DATABASE_URL` (a direct one, when that URL is a transaction pooler's)", WORKER,
             _WORKER_AND_API, checker=check_url, shown="`SKIPLOCK_DATABASE_URL`", contract=4),
    Variable("TASKS", (), "comma-separated modules that define task handlers; imported by the worker (and "
             "by the API, which then validates typed payloads), the current directory searched first", WORKER,
             _WORKER_AND_API, kind="names", more="`--tasks` overrides it", contract=5, readme=2),
    Variable("QUEUES", ("default",), "queues a worker claims from", WORKER, _W, kind="names", checker=_queues,
             more="comma-separated; `--queues` overrides it", contract=6, readme=3),
    Variable("CONCURRENCY", 10, "tasks one worker process runs at once", WORKER, _W, kind="integer",
             bound=positive("integer"),
             more="handler threads; `async def` handlers share one event loop; `--concurrency` overrides it",
             contract=7, readme=4),
    # every role's store waits at most a lease on a silent connection (engine/lifecycle.py run_role)
    Variable("LEASE_SECONDS", 30.0, "lease granted by a claim or a heartbeat", WORKER,
             ("worker", "scheduler", "dispatcher", "dev"), kind="number", bound=positive(), exact=True,
             contract=8, readme=5),
    Variable("HEARTBEAT_SECONDS", 10.0, "must be ≤ lease / 3 or startup fails", WORKER, _W, kind="number",
             shown="lease / 3", derive=lambda values: values["lease_seconds"] / 3,
             more="how often a worker renews every claim it holds, in one statement", contract=9),
    # the scheduler and the dispatcher wait at most this long too between two looks at their tables
    Variable("POLL_SECONDS", 1.0, "poll interval when no notification arrives", WORKER,
             ("worker", "scheduler", "dispatcher", "dev"),
             kind="number", bound=positive(),
             more="also how soon the scheduler sees that a `buffer_one` schedule's previous task ended",
             contract=11),
    Variable("REAPER_SECONDS", 5.0, "how often expired leases are reclaimed", WORKER, ("worker", "scheduler", "dev"),
             kind="number", bound=positive(), more="by every scheduler and, as a fallback, every worker",
             contract=12, field_name="reclaim_seconds"),  # the contract keeps the old word: the code's is reclaim
    Variable("MAX_RECLAIMS", 10, "lease expiries before a task is failed", WORKER, ("worker", "scheduler", "dev"),
             kind="integer", bound=at_least_zero()),
    Variable("CLAIM_BATCH", 0, "most tasks one claim takes; 0: as many as there are free slots", WORKER, _W,
             kind="integer", bound=at_least_zero()),
    Variable("CLAIM_LANES", 0, "most claims of one queue that run at once, across every worker (0: no bound); "
             "a worker that finds them all taken looks again after a pause of about 0.1 s, doubling to 1 s",
             WORKER, _W, kind="integer", bound=Bound(0, f"0-{CLAIM_LANES_MAX} (0: no bound)", high=CLAIM_LANES_MAX),
             more="many worker processes on one queue and a database short of CPU: about its CPU count "
                  "(docs/SCALING.md, many worker processes on one queue)", contract=22),
    Variable("MAX_CHILDREN_PER_RUN", 10_000, "most tasks one run of a handler may enqueue (`ctx.enqueue`, "
             "`ctx.enqueue_many`); one more fails the task at once and none of its children is kept", WORKER, _W,
             kind="integer", bound=Bound(1, ">= 1"),
             more="they commit with the run's outcome in one transaction, which grows with them: a larger "
                  "fan-out goes through steps or through children that enqueue the next part", contract=23),
    Variable("STUCK_GRACE_SECONDS", 10.0, "after a kind's `timeout`, how long a handler that ignores "
             "`ctx.cancel_requested` may keep its thread before it is abandoned (and the task retried)", WORKER, _W,
             kind="number"),
    Variable("POD_DELETION_COST", False, "a worker in a pod keeps its pod's "
             "`controller.kubernetes.io/pod-deletion-cost` annotation near its in-flight count, so scale-in removes "
             "idle workers first (needs `skiplock[kubernetes]` and RBAC to patch its pod; `KUBECONFIG` replaces the "
             "in-cluster configuration when set)", POD, _W, kind="boolean", contract=15),
    Variable("POD_NAME", None, "the worker's own pod's name, from the downward API", POD, _W,
             shown="— (required when `SKIPLOCK_POD_DELETION_COST` is true)", contract=16),
    Variable("POD_NAMESPACE", None, "the worker's own pod's namespace, from the downward API", POD, _W,
             shown="— (required when `SKIPLOCK_POD_DELETION_COST` is true)", contract=17),
    Variable("POD_DELETION_COST_SECONDS", 5.0, "the least time between two patches of that annotation; a patch is "
             "sent only when the value changed", POD, _W, kind="number", bound=positive(), contract=18),
)


def check_relations(s) -> None:
    """What one variable cannot say alone: the heartbeat and the grace against the lease, the pod's
    names when the pod deletion cost is on."""
    if s.heartbeat_seconds <= 0 or s.heartbeat_seconds > s.lease_seconds / 3 + 1e-9:
        raise ConfigError(
            f"SKIPLOCK_HEARTBEAT_SECONDS={s.heartbeat_seconds:g}: must be > 0 and "
            f"<= lease/3 ({s.lease_seconds / 3:g}) so a claim survives two lost heartbeats"
        )
    if s.shutdown_grace_seconds < 0 or s.shutdown_grace_seconds >= s.lease_seconds:
        raise ConfigError(
            f"SKIPLOCK_SHUTDOWN_GRACE_SECONDS={s.shutdown_grace_seconds:g}: must be >= 0 and "
            f"< SKIPLOCK_LEASE_SECONDS ({s.lease_seconds:g}), or drained tasks would be "
            "reclaimed while still running"
        )
    if not s.pod_deletion_cost:
        return
    for variable, value, pattern, what in (("SKIPLOCK_POD_NAME", s.pod_name, _POD_NAME_RE, "name"),
                                           ("SKIPLOCK_POD_NAMESPACE", s.pod_namespace, _NAMESPACE_RE,
                                            "namespace")):
        if not value:
            raise ConfigError(f"{variable}: required when SKIPLOCK_POD_DELETION_COST is true (set it from "
                              f"the downward API, fieldRef metadata.{what})")
        if not pattern.fullmatch(value):
            raise ConfigError(f"{variable}={value!r}: not a Kubernetes pod {what}")

"""The scheduler's variables: the schedules and limits files it applies at start-up, and how often
its maintenance runs (gauges, retention) and what retention keeps.

It declares; it reads no environment.
"""

from __future__ import annotations

from .declaration import SCHEDULER, Variable, at_least_zero, positive

_S = ("scheduler", "dev")
_FOREVER = at_least_zero("(0 keeps them forever)")

VARIABLES: tuple[Variable, ...] = (
    Variable("SCHEDULES_FILE", None, "a schedules YAML file applied at start-up (a mounted ConfigMap)", SCHEDULER, _S),
    Variable("SCHEDULES_PRUNE", False, "with the file, also delete schedules it does not name", SCHEDULER, _S,
             kind="boolean"),
    Variable("LIMITS_FILE", None, "a limits YAML file applied at start-up (a mounted ConfigMap; "
             "`skiplock limits apply -f` takes the same file)", SCHEDULER, _S, contract=24),
    Variable("LIMITS_PRUNE", False, "with the file, also delete the limits of kinds it does not name", SCHEDULER,
             _S, kind="boolean", contract=25),
    Variable("GAUGES_SECONDS", 15.0, "how often the queue gauges are recomputed", SCHEDULER, _S, kind="number",
             bound=positive()),
    Variable("RETENTION_SECONDS", 60.0, "how often retention runs", SCHEDULER, _S, kind="number", bound=positive()),
    Variable("RETAIN_COMPLETED_SECONDS", 86400.0, "completed tasks (and their events) are deleted this long after "
             "finishing; `0` keeps them", SCHEDULER, _S, kind="number", bound=_FOREVER),
    Variable("RETAIN_FAILED_SECONDS", 7 * 86400.0, "the same for failed tasks", SCHEDULER, _S, kind="number",
             bound=_FOREVER),
    Variable("RETAIN_CANCELLED_SECONDS", 7 * 86400.0, "the same for cancelled tasks", SCHEDULER, _S, kind="number",
             bound=_FOREVER),
    Variable("RETAIN_AUDIT_SECONDS", 90 * 86400.0, "audit log rows are deleted this long after they were written; "
             "`0` keeps them", SCHEDULER, _S, kind="number", bound=_FOREVER, shown="`7776000` (90 days)",
             contract=26),
    Variable("RETAIN_SIGNALS_SECONDS", 7 * 86400.0, "signals (`skiplock.send_signal`) are deleted this long after "
             "they were sent; a wait that begins later no longer finds one; `0` keeps them", SCHEDULER, _S,
             kind="number", bound=_FOREVER, shown="`604800` (7 days)", contract=45),
)

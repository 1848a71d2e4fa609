"""How many queues and kinds API submissions may bring into existence.

A queue or kind exists from its first task on (the queue_kinds registry, migration 0015) and
every one costs the console's overview a row and the scheduler's metrics a set of series: a
submitter naming a fresh queue per task made 20,000 of them in a second. A non-admin submission
that names a new one past SKIPLOCK_API_MAX_QUEUES / SKIPLOCK_API_MAX_KINDS is refused (409
task.name_limit), whole, before any of its tasks is written; names that exist are always
accepted. Admins, the library and handlers' ctx.enqueue are not bounded: their code and their
names are the operator's.

It must run inside the submission's transaction: the lock it takes for a new name is held until
that commits, which is what makes two racing submissions count each other.
"""

from __future__ import annotations

from collections.abc import Sequence

from flask import g

from ..engine.errors import NameBoundReached
from ..engine.model import TaskSpec
from ..engine.store import Store
from .app_state import api


def admit(tx: Store, specs: Sequence[TaskSpec]) -> None:
    """Refuse `specs` if they bring more new queues or kinds than the bounds leave room for."""
    settings = api().settings
    bounds = {"queue": settings.api_max_queues, "kind": settings.api_max_kinds}
    if g.principal.role == "admin" or not any(bounds.values()):
        return
    queues, kinds = sorted({s.queue for s in specs}), sorted({s.kind for s in specs})
    if not tx.tasks.queue_kind_new(queues, kinds):
        return  # the usual case: two index probes per name, no lock
    tx.tasks.queue_kind_lock()
    new = tx.tasks.queue_kind_new(queues, kinds)  # again: a submission we waited for may have made some
    existing = dict(zip(("queue", "kind"), tx.tasks.queue_kind_count()))
    for scope, bound in bounds.items():
        names = [name for s, name in new if s == scope]
        if bound and names and existing[scope] + len(names) > bound:
            raise NameBoundReached(
                f"{scope} {names[0]!r}: {existing[scope]:,} {scope}s exist and API submissions may bring at most "
                f"{bound:,} (SKIPLOCK_API_MAX_{scope.upper()}S); use one that exists, or an admin token")

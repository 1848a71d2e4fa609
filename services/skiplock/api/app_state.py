"""What every view shares: the settings, the store, the authenticator and the metrics of the app
serving the request (one per `create_app()`; kept in app.extensions, not in module globals, so
tests can build several apps side by side), and the store this request's reads go to."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from flask import current_app, g

from ..engine.settings import ApiSettings
from ..engine.store import Store
from .auth import Authenticator
from .admission_bounds import AdmissionBounds
from .request_metrics import ApiMetrics

if TYPE_CHECKING:
    from .auth_throttle import AuthThrottle
    from .replica import Replica

KEY = "skiplock"


@dataclasses.dataclass
class ApiContext:
    settings: ApiSettings
    store: Store
    auth: Authenticator
    metrics: ApiMetrics
    # SKIPLOCK_API_TRUSTED_PROXIES, parsed: whose X-Forwarded-For names the client (refusals.py)
    trusted_proxies: tuple = ()
    # submission, large-body and long-poll bounds (None: create_app builds them)
    admission_bounds: AdmissionBounds | None = None
    migrated: bool = False  # /readyz saw no pending migration once; files do not change under a process
    replica: "Replica | None" = None  # SKIPLOCK_READ_DATABASE_URL's (replica.py); None: every read on the primary
    auth_throttle: "AuthThrottle | None" = None  # wrong tokens per client address (auth_throttle.py)


def api() -> ApiContext:
    return current_app.extensions[KEY]


def reads() -> Store:
    """The store of this request's reads: the replica's when the route may read there and
    replica.py chose it for this request, else the primary's (`api().store`)."""
    store = g.get("reads")
    return api().store if store is None else store

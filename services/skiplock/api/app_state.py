"""What every view shares: the settings, the store, the authenticator and the metrics of the app
serving the request (one per `create_app()`; kept in app.extensions, not in module globals, so
tests can build several apps side by side)."""

from __future__ import annotations

import dataclasses

from flask import current_app

from ..engine.settings import Settings
from ..engine.store import Store
from .auth import Authenticator
from .limits import Limits
from .request_metrics import ApiMetrics

KEY = "skiplock"


@dataclasses.dataclass
class ApiContext:
    settings: Settings
    store: Store
    auth: Authenticator
    metrics: ApiMetrics
    # SKIPLOCK_API_TRUSTED_PROXIES, parsed: whose X-Forwarded-For names the client (refusals.py)
    trusted_proxies: tuple = ()
    limits: Limits | None = None  # submission and large-body limits (None: create_app builds them)
    migrated: bool = False  # /readyz saw no pending migration once; files do not change under a process


def api() -> ApiContext:
    return current_app.extensions[KEY]

"""skiplock: a durable task engine on one Postgres.

The public API is this module's names only:

    from skiplock import task, enqueue, enqueue_many, enqueue_async, enqueue_many_async, wait, Step, Retry, Fail
    from skiplock import send_signal, send_signal_async
    from skiplock import Unique, Debounce, TaskId, TaskHandle
    from skiplock import (SkiplockError, InvalidInput, PayloadTooLarge, WaitTimeout, TaskNotFound,
                          DatabaseUnavailable, ConnectionLost, MigrationError, ConfigError)   # what callers catch

Everything else (engine, worker, ...) is internal and may change.
"""

from __future__ import annotations

from .engine.enqueue_options import Debounce, Unique
from .engine.errors import (ConfigError, ConnectionLost, DatabaseUnavailable, InvalidInput, MigrationError,
                            PayloadTooLarge, SkiplockError, TaskNotFound, WaitTimeout)
from .engine.ids import TaskId
from .engine.model import Fail, Retry, Step
from .engine.version import SOURCE_VERSION as __version__
from .enqueueing import enqueue, enqueue_async, enqueue_many, enqueue_many_async, migrate
from .handles import TaskHandle, task
from .signalling import send_signal, send_signal_async
from .waiting import wait

__all__ = ["task", "enqueue", "enqueue_many", "enqueue_async", "enqueue_many_async", "wait", "migrate", "Step", "Retry", "Fail",
           "send_signal", "send_signal_async", "Unique", "Debounce", "TaskId", "TaskHandle",
           "SkiplockError", "InvalidInput", "PayloadTooLarge", "WaitTimeout", "TaskNotFound", "DatabaseUnavailable",
           "ConnectionLost", "MigrationError", "ConfigError"]

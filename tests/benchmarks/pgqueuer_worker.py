"""A PgQueuer worker process, equivalent to ``pgq run tests.benchmarks.handlers_pgqueuer:create
--batch-size $BENCH_PGQ_BATCH``, through PgQueuer's documented Python API ``pgqueuer.run``.

Why not the CLI itself: with pgqueuer 1.6.0 and the typer release pip resolves next to it (0.29.x),
``pgq run`` dies before starting (``setup_fancy_logger``: ``'str' object has no attribute 'name'``,
the ``--log-level`` option's parser returns a str where an enum is expected). This module does what
that command does: the same logger setup, the same event loop (uvloop when installed, as the CLI's
``asyncio_run`` picks it) and the same supervisor, which stops cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import sys

from pgqueuer import run
from pgqueuer.core import logconfig


def main() -> int:
    batch_size = int(os.environ.get("BENCH_PGQ_BATCH", "100"))
    logconfig.setup_fancy_logger(logconfig.LogLevel.WARNING)
    coro = run("tests.benchmarks.handlers_pgqueuer:create", batch_size=batch_size)
    try:
        from pgqueuer.adapters.cli.cli import asyncio_run  # the CLI's own loop choice
    except ImportError:
        asyncio.run(coro)
    else:
        asyncio_run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())

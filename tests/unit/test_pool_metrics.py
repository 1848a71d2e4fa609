"""The pool metrics read psycopg_pool's figures at scrape time; a refused connection for want of
slots is told apart from other connection failures (the roles wait for the first at startup)."""

from __future__ import annotations

from skiplock.engine.errors import DatabaseUnavailable
from skiplock.engine.metrics import Metrics
from skiplock.engine.migrate import slots_exhausted
from tests.support.harness import sample, samples_of


def test_pool_figures_are_read_at_each_scrape():
    figures = {"worker": {"pool_size": 3, "pool_max": 14, "pool_available": 1, "requests_waiting": 2,
                          "requests_wait_ms": 1500, "exhausted": 1, "connections_errors": 4},
               "worker-claims": {"pool_size": 1, "pool_max": 1}}
    metrics = Metrics()
    metrics.watch_pools(lambda: figures)
    samples = samples_of(metrics.render().decode())
    assert sample(samples, "skiplock_db_pool_connections", pool="worker") == 3
    assert sample(samples, "skiplock_db_pool_connections_max", pool="worker-claims") == 1
    assert sample(samples, "skiplock_db_pool_requests_waiting", pool="worker") == 2
    assert sample(samples, "skiplock_db_pool_wait_seconds_total", pool="worker") == 1.5
    assert sample(samples, "skiplock_db_pool_exhausted_total", pool="worker-claims") == 0
    figures["worker"]["requests_wait_ms"] = 4000
    assert sample(samples_of(metrics.render().decode()), "skiplock_db_pool_wait_seconds_total", pool="worker") == 4


def test_slots_exhausted_is_only_the_connection_limit():
    assert slots_exhausted(DatabaseUnavailable('cannot connect to Postgres: connection failed: FATAL:  '
                                               'remaining connection slots are reserved for non-replication '
                                               'superuser connections'))
    assert slots_exhausted(DatabaseUnavailable("FATAL:  sorry, too many clients already"))
    assert not slots_exhausted(DatabaseUnavailable("connection refused"))
    assert not slots_exhausted(DatabaseUnavailable('FATAL:  database "x" does not exist'))

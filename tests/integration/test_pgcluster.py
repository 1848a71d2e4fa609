"""Real-server checks for tests/pgcluster.py's ThrowawayCluster.

Each test initdb's a private cluster, so it needs PostgreSQL binaries (Debian's
or the pgserver package's); it is skipped when those are missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from tests import pgcluster  # noqa: E402
from tests.pgcluster import ThrowawayCluster  # noqa: E402


def _count(url: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute("SELECT count(*) FROM survivor WHERE note = 'hello'").fetchone()[0]


def _lifecycle(cluster: ThrowawayCluster) -> None:
    with cluster:
        base = cluster.base_dir
        assert base is not None and base.is_dir()
        assert cluster.url == f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
        assert cluster.is_running()

        with psycopg.connect(cluster.url, connect_timeout=5) as conn:
            assert conn.execute("SHOW fsync").fetchone()[0] == "off"
            assert conn.execute("SHOW max_connections").fetchone()[0] == "200"
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
            conn.execute("CREATE TABLE survivor (id serial PRIMARY KEY, note text)")
            conn.execute("INSERT INTO survivor (note) VALUES ('hello')")
        # An open connection must be cut by the restart; a new one must work.
        stale = psycopg.connect(cluster.url, connect_timeout=5, autocommit=True)
        old_pid = cluster.pid

        cluster.restart()
        assert cluster.is_running() and cluster.pid != old_pid
        with pytest.raises(psycopg.OperationalError):
            stale.execute("SELECT 1")
        stale.close()
        assert _count(cluster.url) == 1

        killed_pid = cluster.pid
        cluster.kill()
        assert not cluster.is_running()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(cluster.url, connect_timeout=2)

        cluster.start()  # crash recovery on the same data directory
        assert cluster.pid != killed_pid
        assert _count(cluster.url) == 1
        assert "database system was interrupted" in cluster.log_path.read_text()

        cluster.stop()
        assert not cluster.is_running()
        cluster.start()
        assert _count(cluster.url) == 1

    # __exit__ -> cleanup()
    assert cluster.base_dir is None
    assert not base.exists()
    cluster.cleanup()  # idempotent


def test_throwaway_cluster_restart_kill_recover():
    try:
        cluster = ThrowawayCluster()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    _lifecycle(cluster)


def test_throwaway_cluster_pgserver_binaries():
    if pgcluster._pgserver_bindir() is None:
        pytest.skip("pgserver package not installed")
    cluster = ThrowawayCluster(binaries="pgserver")
    assert "pginstall" in str(cluster.bindir)
    _lifecycle(cluster)

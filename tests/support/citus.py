"""A Citus cluster of throwaway PostgreSQL servers on this machine: a coordinator and worker nodes,
each a tests/pgcluster.py ThrowawayCluster with `shared_preload_libraries = 'citus'`, joined into
one cluster on 127.0.0.1 (trust auth, as every throwaway cluster).

Citus is built by scripts/install-citus (`make tools`); `citus_missing()` says in one line why a
machine has no Citus, and tests/distributed skips with that line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg

from tests.pgcluster import ThrowawayCluster

DATABASE = "skiplock"
# a distributed transaction that spans nodes commits in two phases: every node prepares it
CITUS_SETTINGS = {"shared_preload_libraries": "citus", "max_prepared_transactions": 200,
                  "max_connections": 300}
INSTALL_HINT = ("no Citus for PostgreSQL 15 on this machine: `make tools` builds it from ../shared/citus "
                "(or SKIPLOCK_CITUS_SOURCE); elsewhere install Citus 13.2 (github.com/citusdata/citus "
                "releases, or the Citus packages for Debian and Ubuntu)")


def citus_missing() -> str | None:
    """None when citus.so is installed in the PostgreSQL the throwaway clusters run, else why not."""
    try:
        bindir = ThrowawayCluster().bindir
        libdir = subprocess.run([str(bindir / "pg_config"), "--pkglibdir"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        return f"no PostgreSQL to run Citus in ({exc})"
    return None if (Path(libdir) / "citus.so").exists() else INSTALL_HINT


class CitusCluster:
    """A coordinator and `nodes` worker nodes, each with the database DATABASE and the citus extension;
    the worker nodes added to the coordinator's metadata. `url` is the coordinator's (where the roles
    connect), `node_urls` the worker nodes' own (for tests that look at a node's shards)."""

    def __init__(self, nodes: int = 2):
        self.coordinator = ThrowawayCluster(settings=CITUS_SETTINGS)
        self.nodes = [ThrowawayCluster(settings=CITUS_SETTINGS) for _ in range(nodes)]

    @staticmethod
    def _database_url(server: ThrowawayCluster, database: str = DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{server.port}/{database}"

    @property
    def url(self) -> str:
        return self._database_url(self.coordinator)

    @property
    def node_urls(self) -> list[str]:
        return [self._database_url(node) for node in self.nodes]

    def start(self) -> CitusCluster:
        for server in (self.coordinator, *self.nodes):
            server.start()
        self.create_database(DATABASE)
        return self

    def create_database(self, database: str) -> str:
        """A database on every node with the citus extension, the worker nodes added to its
        metadata (Citus keeps a cluster's metadata per database); the coordinator's URL of it."""
        for server in (self.coordinator, *self.nodes):
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {database}")
            with psycopg.connect(self._database_url(server, database), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
        url = self._database_url(self.coordinator, database)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (self.coordinator.port,))
            for node in self.nodes:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (node.port,))
        return url

    def node_url(self, port: int, database: str = DATABASE) -> str:
        """A worker node's own URL of `database` (to read its shards)."""
        return f"postgresql://postgres@127.0.0.1:{port}/{database}"

    def node_of_port(self, port: int) -> ThrowawayCluster:
        return next(node for node in self.nodes if node.port == port)

    def cleanup(self) -> None:
        for server in (*self.nodes, self.coordinator):
            server.cleanup()

    def __enter__(self) -> CitusCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

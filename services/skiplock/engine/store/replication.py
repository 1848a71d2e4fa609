"""Where the WAL stands: one method per statement of engine/sql/replication.sql, named after it.

The API compares a primary's position with a replica's to decide whether the replica may serve a
read (api/replica.py); this module only reads the positions.
"""

from __future__ import annotations

from .database import Database


class ReplicationStore:
    """Queries of the WAL positions (no table of skiplock's)."""

    def __init__(self, db: Database):
        self.db = db

    def wal_flush_position(self, timeout: float | None = None) -> int:
        """On the primary: the WAL flushed so far, in bytes (what a standby can have received).
        `timeout`: the longest wait for a connection (default the pool's)."""
        with self.db.connection(timeout) as conn:
            return conn.execute(self.db.sql["wal_flush_position"]).fetchone()[0]

    def wal_insert_position(self) -> int:
        """On the primary: a WAL position at or past every commit made before this call."""
        return self.db.fetch("wal_insert_position", {})[0][0]

    def wal_replay_position(self) -> int | None:
        """On a replica: the WAL replayed so far, in bytes; None when the server is not a standby
        (a primary lags behind nothing)."""
        standby, position = self.db.fetch("wal_replay_position", {})[0]
        return position if standby else None

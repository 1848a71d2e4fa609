"""Sign-in state kept on the server: the console's sessions ended, and wrong tokens per client
address. One method per statement of engine/sql/console.sql.

Which session a request carries, and whether it is signed in, is the console's business
(api/console/session.py); this only records and answers what was ended.
"""

from __future__ import annotations

from .database import Database


class ConsoleSessionStore:
    """Queries of console_sessions_ended, console_token_sign_outs and auth_failures."""

    def __init__(self, db: Database):
        self.db = db

    def console_session_end(self, session_id: str, max_age_seconds: float) -> None:
        """Sign out one session; forgets sign-outs older than `max_age_seconds` (no cookie that
        old is valid any more)."""
        self.db.fetch("console_session_end", dict(session_id=session_id, max_age=max_age_seconds))

    def console_session_ended(self, session_id: str, token_name: str, generation: int) -> bool:
        return bool(self.db.fetch("console_session_ended", dict(session_id=session_id, token_name=token_name,
                                                                generation=generation))[0][0])

    def console_token_generation(self, token_name: str) -> int:
        """The generation a session opened now with that token carries."""
        return int(self.db.fetch("console_token_generation", dict(token_name=token_name))[0][0])

    def console_token_sign_out(self, token_name: str) -> int:
        """Ends every session opened with that token so far; the new generation."""
        return int(self.db.fetch("console_token_sign_out", dict(token_name=token_name))[0][0])

    def auth_failure_record(self, client: str, window_seconds: float) -> tuple[int, float]:
        """One wrong token from `client`: (failures in its current window, seconds left in it)."""
        failures, left = self.db.fetch("auth_failure_record", dict(client=client, window=window_seconds))[0]
        return int(failures), float(left)

"""Settings from the environment: defaults, *_FILE secrets, and one-line errors naming the variable."""

from __future__ import annotations

import pytest

from skiplock.engine.errors import ConfigError
from skiplock.engine.settings import Settings


def test_defaults():
    s = Settings.from_env({})
    assert s.queues == ("default",) and s.concurrency == 10
    assert s.lease_seconds == 30 and s.heartbeat_seconds == 10 and s.shutdown_grace_seconds == 25
    assert s.poll_seconds == 1 and s.reclaim_seconds == 5 and s.metrics_port == 9090
    assert s.db_schema == "skiplock" and s.channel == "skiplock_skiplock"


def test_heartbeat_defaults_to_a_third_of_the_lease_and_grace_stays_below_it():
    s = Settings.from_env({"SKIPLOCK_LEASE_SECONDS": "6"})
    assert s.heartbeat_seconds == 2 and s.shutdown_grace_seconds == 5


def test_secret_from_file(tmp_path):
    secret = tmp_path / "url"
    secret.write_text("postgresql://u@h/db\n")
    s = Settings.from_env({"SKIPLOCK_DATABASE_URL_FILE": str(secret)})
    assert s.database_url == "postgresql://u@h/db"


def test_the_console_session_key_is_a_secret_of_its_own(tmp_path):
    secret = tmp_path / "session-key"
    secret.write_text("k" * 43 + "\n")
    s = Settings.from_env({"SKIPLOCK_CONSOLE_SESSION_KEY_FILE": str(secret)})
    assert s.console_session_key == "k" * 43
    assert "k" * 43 not in repr(s)  # settings are logged and printed: the key never with them
    assert Settings.from_env({}).console_session_key is None  # no default, nothing derived
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SKIPLOCK_CONSOLE_SESSION_KEY": "short-key"})
    assert str(refused.value) == ("SKIPLOCK_CONSOLE_SESSION_KEY: 9 characters; use at least 32 random ones "
                                  "(e.g. `openssl rand -base64 32`)")


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"SKIPLOCK_HEARTBEAT_SECONDS": "20"}, "SKIPLOCK_HEARTBEAT_SECONDS=20"),
        ({"SKIPLOCK_SHUTDOWN_GRACE_SECONDS": "30"}, "SKIPLOCK_SHUTDOWN_GRACE_SECONDS=30"),
        ({"SKIPLOCK_CONCURRENCY": "0"}, "SKIPLOCK_CONCURRENCY=0"),
        ({"SKIPLOCK_CONCURRENCY": "ten"}, "SKIPLOCK_CONCURRENCY='ten'"),
        ({"SKIPLOCK_QUEUES": "ok,bad queue"}, "SKIPLOCK_QUEUES"),
        ({"SKIPLOCK_LEASE_SECONDS": "nan"}, "SKIPLOCK_LEASE_SECONDS"),
        ({"SKIPLOCK_DB_SCHEMA": "x; drop"}, "SKIPLOCK_DB_SCHEMA"),
        ({"SKIPLOCK_LOG_FORMAT": "xml"}, "SKIPLOCK_LOG_FORMAT"),
        ({"SKIPLOCK_DATABASE_URL_FILE": "/nonexistent/secret"}, "SKIPLOCK_DATABASE_URL_FILE"),
        ({"SKIPLOCK_READ_MAX_LAG_SECONDS": "0"}, "SKIPLOCK_READ_MAX_LAG_SECONDS=0"),
    ],
)
def test_bad_values_name_the_variable(env, fragment):
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_database_url_is_required_where_used():
    with pytest.raises(ConfigError, match="SKIPLOCK_DATABASE_URL: required"):
        Settings.from_env({}).require_database_url()

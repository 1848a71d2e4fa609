"""`skiplock webhooks` and `skiplock deliveries` as an operator runs them."""

from __future__ import annotations

import re

import pytest

from skiplock.engine.webhooks import check_secret
from tests.acceptance.test_cli import skiplock
from tests.support.harness import free_port, scalar

LOCAL = {"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}


def one_error_line(done) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("url, fragment", [
    ("http://10.0.0.1/x", "10.0.0.1, which is not a public address"),
    ("http://169.254.169.254/latest", "169.254.169.254, which is not a public address"),
    ("http://[::1]/x", "::1, which is not a public address"),
    ("http://2130706433/x", "resolves to 127.0.0.1, which is not a public address"),
    ("ftp://example.com/x", "scheme 'ftp' is not supported"),
    ("http://example.com:99999/x", "malformed"),
])
def test_add_refuses_bad_and_internal_urls(db_url, db, url, fragment):
    done = skiplock("webhooks", "add", url, url=db_url)
    line = one_error_line(done)
    assert line.startswith("skiplock webhooks: ") and fragment in line
    assert done.stdout == ""
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_endpoints") == 0


@pytest.mark.parametrize("args, fragment", [
    (("--events", ""), "events: give at least one event type"),
    (("--events", "task.done"), "unknown event type 'task.done'"),
    (("--events", "task.completed,nope"), "unknown event type 'nope'"),
    (("--secret", "not-a-whsec"), "must start with 'whsec_'"),
    (("--secret", "whsec_c2hvcnQ="), "the key is 5 bytes"),
])
def test_add_refuses_bad_events_and_secrets(db_url, db, args, fragment):
    done = skiplock("webhooks", "add", "http://127.0.0.1:9999/hook", *args, url=db_url, **LOCAL)
    assert fragment in one_error_line(done)
    assert scalar(db, "SELECT count(*) FROM skiplock.webhook_endpoints") == 0


def test_endpoint_lifecycle(db_url, db):
    port = free_port()
    hook = f"http://127.0.0.1:{port}/hook"
    assert skiplock("webhooks", "list", url=db_url).stdout == "no webhook endpoints\n"

    added = skiplock("webhooks", "add", hook, "--events", "task.completed,task.failed", "--description", "billing",
                     url=db_url, **LOCAL)
    assert added.returncode == 0, added.stderr
    match = re.fullmatch(r"id: (\S+)\nsecret: (whsec_\S+)   \(shown once: store it with the receiver\)\n",
                         added.stdout)
    assert match, added.stdout
    endpoint_id, secret = match.groups()
    assert check_secret(secret) == secret
    assert db.execute("SELECT url, secret, event_types, description, enabled FROM skiplock.webhook_endpoints "
                      "WHERE id = %s", (endpoint_id,)).fetchone() == \
        (hook, secret, ["task.completed", "task.failed"], "billing", True)
    assert scalar(db, "SELECT tgenabled FROM pg_trigger WHERE tgname = 'task_events_outbox'") == "O"

    listed = skiplock("webhooks", "list", url=db_url)
    assert listed.returncode == 0
    header, row = listed.stdout.splitlines()
    assert header.split() == ["ID", "URL", "EVENTS", "STATE", "PENDING", "DEAD", "CREATED", "(UTC)"]
    assert row.split()[:6] == [endpoint_id, hook, "task.completed,task.failed", "enabled", "0", "0"]

    rotated = skiplock("webhooks", "rotate-secret", endpoint_id, url=db_url)
    assert rotated.returncode == 0, rotated.stderr
    new_secret = re.fullmatch(r"secret: (whsec_\S+)   \(shown once\)\n", rotated.stdout).group(1)
    assert new_secret != secret and check_secret(new_secret) == new_secret
    assert scalar(db, "SELECT secret FROM skiplock.webhook_endpoints WHERE id = %s", (endpoint_id,)) == new_secret

    given = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="
    second = skiplock("webhooks", "add", hook, "--secret", given, url=db_url, **LOCAL)
    assert second.returncode == 0 and f"secret: {given}" in second.stdout

    redeliver = skiplock("deliveries", "redeliver", "--endpoint", endpoint_id, url=db_url)
    assert (redeliver.returncode, redeliver.stdout) == (0, "0 deliveries queued again\n")
    listed = skiplock("deliveries", "list", "--endpoint", endpoint_id, url=db_url)
    assert (listed.returncode, listed.stdout) == (0, "no deliveries\n")

    # disabled (as a 410 would), then enabled again
    db.execute("UPDATE skiplock.webhook_endpoints SET enabled = false, disabled_reason = 'receiver answered 410' "
               "WHERE id = %s", (endpoint_id,))
    assert "disabled (receiver answered 410)" in skiplock("webhooks", "list", url=db_url).stdout
    enabled = skiplock("webhooks", "enable", endpoint_id, url=db_url)
    assert (enabled.returncode, enabled.stdout) == (0, f"enabled: {endpoint_id}\n")

    removed = skiplock("webhooks", "remove", endpoint_id, url=db_url)
    assert (removed.returncode, removed.stdout) == (0, f"removed: {endpoint_id}\n")
    assert endpoint_id not in skiplock("webhooks", "list", url=db_url).stdout
    again = skiplock("webhooks", "remove", endpoint_id, url=db_url)
    assert "not found" in one_error_line(again)


@pytest.mark.parametrize("args, fragment", [
    (("webhooks", "remove", "not-a-uuid"), "webhook id 'not-a-uuid' is not a UUID"),
    (("webhooks", "rotate-secret", "not-a-uuid"), "is not a UUID"),
    (("webhooks", "enable", "00000000-0000-0000-0000-000000000000"), "not found"),
    (("deliveries", "redeliver", "not-a-uuid"), "delivery id 'not-a-uuid' is not a UUID"),
    (("deliveries", "redeliver", "00000000-0000-0000-0000-000000000000"), "no dead delivery"),
    (("deliveries", "list", "--limit", "0"), "--limit 0: must be 1-1000"),
])
def test_bad_ids_are_one_line_errors(db_url, args, fragment):
    done = skiplock(*args, url=db_url)
    line = one_error_line(done)
    assert line.startswith(f"skiplock {args[0]}: ") and fragment in line


@pytest.mark.parametrize("env, fragment", [
    ({"SKIPLOCK_WEBHOOK_LEASE_SECONDS": "3", "SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS": "2"},
     "SKIPLOCK_SHUTDOWN_GRACE_SECONDS=25: must be < SKIPLOCK_WEBHOOK_LEASE_SECONDS (3)"),
    ({"SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS": "30"}, "SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS=30: must be < SKIPLOCK_WEBHOOK_LEASE_SECONDS"),
    ({"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/33"}, "'10.0.0.0/33' is not a CIDR network"),
])
def test_dispatcher_refuses_bad_configuration(db_url, env, fragment):
    done = skiplock("dispatcher", url=db_url, **env)
    assert fragment in one_error_line(done)

"""The PrometheusRule's rules pass `promtool check rules`, and `promtool test rules` proves each
alert fires when it should and stays quiet when it should (tests/chart/alerts_test.yaml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.chart import rendering as r

HERE = Path(__file__).resolve().parent
ALERTS = {"SkiplockQueueStalled", "SkiplockTaskReclaimsRising", "SkiplockWebhookDeadLetters",
          "SkiplockOutboxBacklog", "SkiplockScheduleLagging"}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make test` installs it (scripts/install-test-tools)"
    return path


def rendered_rules() -> dict:
    objs = r.objects(r.render({"postgresql": {"enabled": False}, "database": {"existingSecret": "db"},
                               "api": {"auth": {"existingSecret": "t"}},
                               "metrics": {"prometheusRule": {"enabled": True}}}))
    (rule,) = r.kind(objs, "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def test_rules_pass_promtool_check(tmp_path):
    rules = rendered_rules()
    assert {x["alert"] for g in rules["groups"] for x in g["rules"]} == ALERTS
    path = tmp_path / "skiplock-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_every_alert_has_a_passing_unit_test(tmp_path):
    (tmp_path / "skiplock-rules.yaml").write_text(yaml.safe_dump(rendered_rules(), sort_keys=False))
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    firing = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert firing == ALERTS, "every alert needs a case where it fires"
    done = subprocess.run([promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_a_wrong_expectation_fails(tmp_path):
    """The unit tests can fail: the same file with one expectation removed does."""
    (tmp_path / "skiplock-rules.yaml").write_text(yaml.safe_dump(rendered_rules(), sort_keys=False))
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())
    tests["tests"][0]["alert_rule_test"][1]["exp_alerts"].pop()
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr

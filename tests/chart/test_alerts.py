"""The PrometheusRule's rules pass `promtool check rules`, and `promtool test rules` proves each
alert fires when it should and stays quiet when it should (tests/chart/alerts_test.yaml). Each
alert's runbook_url leads to its section of docs/OPERATIONS.md."""

from __future__ import annotations

import re
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
    # the check can fail (by its exit status, not promtool's wording): one rule's expression broken
    rules["groups"][0]["rules"][-1]["expr"] += " +"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    broken = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0, broken.stdout + broken.stderr


def test_every_alert_has_a_passing_unit_test(tmp_path):
    (tmp_path / "skiplock-rules.yaml").write_text(yaml.safe_dump(rendered_rules(), sort_keys=False))
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
    firing = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert firing == ALERTS, "every alert needs a case where it fires"
    done = subprocess.run([promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_expectation_fails(tmp_path):
    """The unit tests can fail: the same file with one expectation removed does."""
    (tmp_path / "skiplock-rules.yaml").write_text(yaml.safe_dump(rendered_rules(), sort_keys=False))
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())
    tests["tests"][0]["alert_rule_test"][1]["exp_alerts"].pop()
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout + done.stderr


def _runbook_urls(**rule_values) -> dict[str, str | None]:
    values = {"postgresql": {"enabled": False}, "database": {"existingSecret": "db"},
              "api": {"auth": {"existingSecret": "t"}},
              "metrics": {"prometheusRule": {"enabled": True, **rule_values}}}
    (rule,) = r.kind(r.objects(r.render(values)), "PrometheusRule")
    return {x["alert"]: x["annotations"].get("runbook_url") for g in rule["spec"]["groups"] for x in g["rules"]}


def test_every_alert_links_its_runbook_section():
    """Each alert's runbook_url is the runbook base and the anchor of the alert's own section of
    docs/OPERATIONS.md (a `### <alert name>` heading: what it means, what to check, what to do)."""
    from markdown.extensions.toc import slugify

    runbook = (HERE.parents[1] / "docs" / "OPERATIONS.md").read_text()
    anchors = {slugify(h, "-") for h in re.findall(r"(?m)^#+ (.+)$", runbook)}
    urls = _runbook_urls()
    assert set(urls) == ALERTS
    for alert, url in urls.items():
        base, anchor = url.split("#")
        assert base == "docs/OPERATIONS.md" and anchor == alert.lower(), url
        assert anchor in anchors, f"docs/OPERATIONS.md has no section for {alert}"
        section = runbook.split(f"### {alert}\n", 1)[1].split("\n### ", 1)[0]
        assert "What it means" in section and "What to check" in section and "what to do" in section.lower()
    site = "https://docs.example/skiplock/OPERATIONS/"
    assert _runbook_urls(runbookBaseUrl=site)["SkiplockQueueStalled"] == site + "#skiplockqueuestalled"
    assert set(_runbook_urls(runbookBaseUrl="").values()) == {None}

"""The README's "Deploy on Kubernetes" steps, line by line: every command in its shell blocks is
either run here (the Helm commands by the real Helm engine, with the README's own flags) or quoted
from the chart's rendered NOTES, and the image build and push lines are run by tests/image. A line
of a kind nothing checks fails the test, so the README cannot drift from what is tested."""

from __future__ import annotations

import re

from tests.chart import rendering as r
from tests.support.readme import deploy_argv, deploy_commands, exported


def _helm(prefix: str, variables: dict[str, str]) -> tuple[str, list[str], dict]:
    argv = deploy_argv(prefix, variables)
    verb, release, chart = argv[1:4]
    assert (release, chart) == (r.RELEASE, "charts/skiplock"), argv
    namespace = argv[argv.index("--namespace") + 1]
    assert namespace == r.NAMESPACE, argv
    # the README's --set flags, read as `make chart` reads them (Helm's own parser)
    return verb, argv, r.user_values([], [arg for flag, arg in zip(argv, argv[1:]) if flag == "--set"])


def test_every_deploy_command_is_checked():
    commands = deploy_commands()
    known = re.compile(r"export REGISTRY=|podman (build|push) |helm (install|upgrade) |"
                       r"export SKIPLOCK_TOKEN=|kubectl |curl ")
    unchecked = [c for c in commands if not known.match(c)]
    assert not unchecked, f"README deploy commands no test checks: {unchecked}"
    # build, push, install, the token, the API and the dashboard, in that order
    order = [next(i for i, c in enumerate(commands) if c.startswith(p))
             for p in ("podman build", "podman push", "helm install", "export SKIPLOCK_TOKEN", "curl ",
                       "helm upgrade")]
    assert order == sorted(order), commands


def test_helm_commands_render_what_the_readme_says():
    commands = deploy_commands()
    variables = exported(commands)
    verb, argv, values = _helm("helm install ", variables)
    assert verb == "install" and "--create-namespace" in argv
    rendered = r.render(values)
    objs = r.objects(rendered)
    images = {c["image"] for o in objs if r.pod_spec(o) for c in r.pod_spec(o)["containers"]
              if "skiplock" in c["image"]}
    # the image the build step tags is the image every skiplock pod runs
    build = deploy_argv("podman build", variables)
    assert images == {build[build.index("-t") + 1]}, images
    # a working system with no other values: the bundled Postgres and a generated token
    assert r.by_name(objs, "StatefulSet", "skiplock-postgresql")
    assert "admin-token" in r.by_name(objs, "Secret", "skiplock-api-tokens")["data"]

    # every kubectl and curl line is quoted from the NOTES this install prints
    notes = rendered["skiplock/templates/NOTES.txt"]
    quoted = [c for c in commands if c.startswith(("kubectl ", "curl ", "export SKIPLOCK_TOKEN="))]
    assert len(quoted) == 4, quoted
    missing = [c for c in quoted if c not in notes]
    assert not missing, f"README lines not in the install's NOTES: {missing}"
    assert "http://localhost:8080/ui/ (sign in with an API token)" in notes

    verb, argv, more = _helm("helm upgrade ", variables)
    assert verb == "upgrade" and "--reuse-values" in argv
    upgraded = r.objects(r.render(r.merge(values, more), is_upgrade=True))
    kinds = {o["kind"] for o in upgraded}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    dashboard = r.by_name(upgraded, "ConfigMap", "skiplock-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert '"title": "skiplock"' in dashboard["data"]["skiplock.json"]

"""Rendering charts/skiplock with the real Helm engine (helm-python-sdk, Helm v4's Go code) and
turning the output into Kubernetes objects. Nothing here talks to a cluster or the network.
The render itself is `make chart`'s (scripts/render_chart.py): the tests check what it prints."""

from __future__ import annotations

from functools import lru_cache

import yaml

# the chart tests name these as rendering's
from scripts.render_chart import CHART, NAMESPACE, RELEASE, ROOT, merge, render, user_values

SCENARIOS = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
# The chart is linted and validated against the newest Kubernetes whose schemas the installed
# kubernetes-validate ships (a release that adds one moves the tests to it), never below the floor
# this suite was written against (pyproject.toml's kubernetes-validate>=1.37).
KUBE_VERSION_FLOOR = "1.37.0"


def newest_kube_version(floor: str = KUBE_VERSION_FLOOR) -> str:
    import kubernetes_validate

    newest = kubernetes_validate.latest_version()
    as_tuple = lambda version: tuple(int(part) for part in version.split("."))  # noqa: E731
    assert as_tuple(newest) >= as_tuple(floor), f"kubernetes-validate ships schemas up to {newest}, below {floor}"
    return newest


KUBE_VERSION = newest_kube_version()

ROLES = ("api", "worker", "scheduler", "dispatcher")


def scenario_values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text()) or {}


def objects(rendered: dict[str, str]) -> list[dict]:
    """Every manifest of a render (NOTES.txt excluded), parsed; a template whose YAML does not
    parse fails here."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("metadata", {})["_template"] = path
                out.append(doc)
    return out


@lru_cache(maxsize=None)
def _cached(name: str) -> tuple:
    return tuple(objects(render(scenario_values(name))))


def scenario_objects(name: str) -> list[dict]:
    import copy

    return copy.deepcopy(list(_cached(name)))


def strip_private(obj: dict) -> dict:
    import copy

    clean = copy.deepcopy(obj)
    clean.get("metadata", {}).pop("_template", None)
    return clean


def kind(objs: list[dict], kind_name: str) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind_name]


def by_name(objs: list[dict], kind_name: str, name: str) -> dict:
    matches = [o for o in objs if o.get("kind") == kind_name and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind_name}/{name}: {len(matches)} rendered"
    return matches[0]


def pod_spec(obj: dict) -> dict | None:
    if obj.get("kind") == "Pod":
        return obj["spec"]
    if obj.get("kind") in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
        return obj["spec"]["template"]["spec"]
    return None


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}

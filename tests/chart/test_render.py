"""The chart renders, lints strict, validates against Kubernetes' schemas, and keeps its
invariants in every ci/*-values.yaml scenario; bad values are refused."""

from __future__ import annotations

import base64
import re
from urllib.parse import urlsplit

import pytest
import yaml

from tests.chart import rendering as r

pytestmark = pytest.mark.timeout(120)

SCENARIOS = r.SCENARIOS
EXPECTED_SCENARIOS = {"minimal", "ha-hpa", "keda", "everything"}
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject", "TriggerAuthentication"}


def test_every_required_scenario_exists():
    assert EXPECTED_SCENARIOS <= set(SCENARIOS), SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(scenario):
    import helm_python as helm

    report = helm.lint(str(r.CHART), r.scenario_values(scenario), strict=True, namespace=r.NAMESPACE,
                       kube_version="v" + r.KUBE_VERSION)
    # severity 1 is INFO ("icon is recommended"); strict lint fails on warnings (2) and errors (3)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["total_charts_linted"] == 1
    assert not problems and not report["errors"], report


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_manifests_validate_strictly(scenario):
    import kubernetes_validate

    objs = r.scenario_objects(scenario)
    assert len(objs) >= 10
    builtin = [o for o in objs if o["kind"] not in CRD_KINDS]
    for obj in builtin:
        try:
            kubernetes_validate.validate(r.strip_private(obj), r.KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at "
                                 f"{'.'.join(map(str, exc.path))}") from None
    for obj in objs:
        labels = obj["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                    "app.kubernetes.io/version", "helm.sh/chart"):
            assert key in labels, f"{obj['kind']}/{obj['metadata']['name']} lacks label {key}"


# Required fields of the CRDs we render, from their published schemas (prometheus-operator
# monitoring.coreos.com/v1, KEDA keda.sh/v1alpha1); unknown keys at the levels we write are refused.
def _check_crd(obj):
    kind, spec = obj["kind"], obj.get("spec")
    assert isinstance(spec, dict), f"{kind} has no spec"
    if kind == "ServiceMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
        assert "selector" in spec and spec["endpoints"]
        for ep in spec["endpoints"]:
            assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings", "metricRelabelings"}
            assert re.fullmatch(r"\d+(ms|s|m|h)", ep["interval"])
    elif kind == "PodMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert "selector" in spec and spec["podMetricsEndpoints"]
        for ep in spec["podMetricsEndpoints"]:
            assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings"}
    elif kind == "PrometheusRule":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert spec["groups"]
        for group in spec["groups"]:
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert ("alert" in rule) != ("record" in rule) and rule["expr"]
                assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}
    elif kind == "ScaledObject":
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert spec["scaleTargetRef"]["name"] and spec["triggers"]
        for trig in spec["triggers"]:
            assert trig["type"] and isinstance(trig["metadata"], dict)
            assert all(isinstance(v, str) for v in trig["metadata"].values()), "KEDA metadata values are strings"
        assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    elif kind == "TriggerAuthentication":
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        for ref in spec["secretTargetRef"]:
            assert {"parameter", "name", "key"} <= set(ref)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_custom_resources_have_required_fields(scenario):
    objs = r.scenario_objects(scenario)
    crds = [o for o in objs if o["kind"] in CRD_KINDS]
    for obj in crds:
        _check_crd(obj)
    if scenario == "everything":
        assert {o["kind"] for o in crds} == {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject"}
    if scenario == "keda":
        assert sorted(o["kind"] for o in crds) == ["ScaledObject", "TriggerAuthentication"]


# ---- invariants ----------------------------------------------------------------------------------

def _pss_restricted_violations(name: str, spec: dict) -> list[str]:
    """The Kubernetes 'restricted' Pod Security Standard, checked field by field."""
    bad = []
    psc = spec.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            bad.append(f"{name}: {field}")
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}
        if not kinds <= allowed:
            bad.append(f"{name}: volume type {kinds - allowed}")
    pod_nonroot = psc.get("runAsNonRoot") is True
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    if psc.get("runAsUser") == 0:
        bad.append(f"{name}: pod runAsUser 0")
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        where = f"{name}/{c['name']}"
        if sc.get("privileged"):
            bad.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{where}: allowPrivilegeEscalation must be false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            bad.append(f"{where}: capabilities must drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{where}: adds capabilities")
        if not (sc.get("runAsNonRoot") is True or (pod_nonroot and sc.get("runAsNonRoot") is not False)):
            bad.append(f"{where}: runAsNonRoot")
        if sc.get("runAsUser") == 0:
            bad.append(f"{where}: runAsUser 0")
        seccomp = sc.get("seccompProfile", {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{where}: seccompProfile")
        if c.get("ports"):
            if any(p.get("hostPort") for p in c["ports"]):
                bad.append(f"{where}: hostPort")
        # not part of the standard, but the image is built for it
        if sc.get("readOnlyRootFilesystem") is not True:
            bad.append(f"{where}: readOnlyRootFilesystem")
    return bad


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_meets_the_restricted_pod_security_standard(scenario):
    objs = r.scenario_objects(scenario)
    pods = [(f"{o['kind']}/{o['metadata']['name']}", r.pod_spec(o)) for o in objs if r.pod_spec(o)]
    assert len(pods) >= 4
    violations = [v for name, spec in pods for v in _pss_restricted_violations(name, spec)]
    assert violations == []
    for name, spec in pods:
        assert spec.get("automountServiceAccountToken") is False, f"{name} mounts a token it never uses"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_grace_is_below_the_lease_which_is_below_the_termination_period(scenario):
    objs = r.scenario_objects(scenario)
    deployments = r.kind(objs, "Deployment")
    roles = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments}
    assert {"worker"} <= roles and roles <= set(r.ROLES)
    for dep in deployments:
        spec = r.pod_spec(dep)
        (main,) = spec["containers"]
        env = r.env_of(main)
        grace, lease = float(env["SKIPLOCK_SHUTDOWN_GRACE_SECONDS"]), float(env["SKIPLOCK_LEASE_SECONDS"])
        termination = spec["terminationGracePeriodSeconds"]
        name = dep["metadata"]["name"]
        assert grace < lease < termination, f"{name}: grace {grace}, lease {lease}, termination {termination}"
        if "SKIPLOCK_WEBHOOK_LEASE_SECONDS" in env:
            webhook_lease = float(env["SKIPLOCK_WEBHOOK_LEASE_SECONDS"])
            assert float(env["SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS"]) < webhook_lease
            assert grace < webhook_lease < termination
        if main["name"] == "api":
            # the sleep and the drain both fit in the termination period
            pre_stop = main["lifecycle"]["preStop"]["exec"]["command"]
            assert pre_stop[0] == "sleep" and int(pre_stop[1]) + grace < termination
        else:
            # no hook: the kubelet's SIGTERM starts the drain at once and is the only signal (a
            # hook that signalled the process itself would fail as the container exits under it)
            assert "lifecycle" not in main, f"{name}: {main.get('lifecycle')}"
        probes = {p: main[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
        assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
        assert probes["startupProbe"]["path"] == "/healthz"
        port_names = {p["name"] for p in main["ports"]}
        assert {p["port"] for p in probes.values()} <= port_names


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_deployment_waits_for_migrations_and_the_job_applies_them(scenario):
    objs = r.scenario_objects(scenario)
    deployments = r.kind(objs, "Deployment")
    for dep in deployments:
        inits = r.pod_spec(dep).get("initContainers", [])
        commands = [" ".join(c.get("command", []) + c.get("args", [])) for c in inits]
        assert any("skiplock migrate --check" in c and "until" in c for c in commands), dep["metadata"]["name"]
    (job,) = r.kind(objs, "Job")
    (container,) = r.pod_spec(job)["containers"]
    assert container["command"] + container["args"] == ["skiplock", "migrate"]
    annotations = job["metadata"].get("annotations", {})
    values = r.scenario_values(scenario)
    if values.get("migrations", {}).get("useHelmHooks", True):
        assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    else:
        assert "helm.sh/hook" not in annotations and annotations["argocd.argoproj.io/hook"] == "Sync"


DEFAULT_PASSWORDS = {"", "postgres", "password", "skiplock", "changeme", "secret", "admin", "root"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_secret_has_an_empty_or_default_password(scenario):
    objs = r.scenario_objects(scenario)
    secrets = r.kind(objs, "Secret")
    values = r.scenario_values(scenario)
    uses_existing = bool(values.get("database", {}).get("existingSecret"))
    assert uses_existing or secrets, "the chart made no database Secret"
    for secret in secrets:
        data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        assert data and all(v.strip() for v in data.values()), secret["metadata"]["name"]
        for key, value in data.items():
            if key == "password":
                assert value not in DEFAULT_PASSWORDS and len(value) >= 16
            if key == "url":
                parts = urlsplit(value)
                assert parts.scheme in ("postgresql", "postgres") and parts.password
                assert parts.password not in DEFAULT_PASSWORDS
    if values.get("postgresql", {}).get("enabled"):
        # the URL the roles read and the password Postgres starts with are the same
        pw = base64.b64decode(r.by_name(objs, "Secret", "skiplock-postgresql")["data"]["password"]).decode()
        url = base64.b64decode(r.by_name(objs, "Secret", "skiplock-database")["data"]["url"]).decode()
        assert urlsplit(url).password == pw


def test_two_installs_generate_different_dev_passwords():
    values = {"postgresql": {"enabled": True}, "api": {"auth": {"enabled": False}}}
    first = r.objects(r.render(values))
    second = r.objects(r.render(values))
    pw = [r.by_name(o, "Secret", "skiplock-postgresql")["data"]["password"] for o in (first, second)]
    assert pw[0] != pw[1]


def test_config_changes_roll_the_pods():
    base = {"database": {"url": "postgresql://u:Zx9-unique-pass@db/skiplock"},
            "api": {"auth": {"tokens": ["ops:admin:" + "a" * 64]}},
            "scheduler": {"schedules": [{"name": "s1", "kind": "demo.hello", "interval_seconds": 60}]}}
    changed = yaml.safe_load(yaml.safe_dump(base))
    changed["scheduler"]["schedules"][0]["interval_seconds"] = 120
    changed["database"]["url"] = "postgresql://u:Zx9-other-pass@db/skiplock"

    def annotations(values):
        objs = r.objects(r.render(values))
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]
                for d in r.kind(objs, "Deployment")}

    before, after = annotations(base), annotations(changed)
    assert len(before) == 4
    for name in before:
        assert before[name]["checksum/database"] != after[name]["checksum/database"], name
    assert before["skiplock-scheduler"]["checksum/schedules"] != after["skiplock-scheduler"]["checksum/schedules"]


def test_schedules_configmap_holds_the_values_schedules():
    objs = r.scenario_objects("everything")
    cm = r.by_name(objs, "ConfigMap", "skiplock-schedules")
    doc = yaml.safe_load(cm["data"]["schedules.yaml"])
    assert [s["name"] for s in doc["schedules"]] == [
        s["name"] for s in r.scenario_values("everything")["scheduler"]["schedules"]]


def test_values_yaml_documents_every_key():
    """Every leaf key (helm-docs style) has a `# --` comment in the comment block right above it."""
    lines = (r.CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    ancestors: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(- )?([A-Za-z][\w.-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)) + (2 if m.group(2) else 0), m.group(3), m.group(4).strip()
        while ancestors and ancestors[-1][0] >= indent:
            ancestors.pop()
        j, block = i - 1, []
        while j >= 0 and lines[j].strip().startswith("#"):
            block.append(lines[j].strip())
            j -= 1
        documented = any(c.startswith("# --") for c in block)
        inherited = any(doc for _, doc in ancestors)
        ancestors.append((indent, documented or inherited))
        if documented or inherited:
            continue
        if rest == "":
            following = next((l for l in lines[i + 1:] if l.strip() and not l.strip().startswith("#")), "")
            if len(following) - len(following.lstrip()) > indent and not following.lstrip().startswith("- "):
                continue  # a parent mapping: its leaves carry the comments
        undocumented.append(key)
    assert undocumented == []


def test_schema_types_every_leaf_and_closes_every_object():
    import json

    schema = json.loads((r.CHART / "values.schema.json").read_text())
    values = yaml.safe_load((r.CHART / "values.yaml").read_text())
    missing = []

    def walk(value, node, path):
        if isinstance(value, dict) and node.get("properties") is not None:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
            for k, v in value.items():
                if k not in node["properties"]:
                    missing.append(f"{path}.{k}")
                else:
                    walk(v, node["properties"][k], f"{path}.{k}")
        else:
            assert node.get("type") or node.get("enum"), f"{path} is untyped"

    walk(values, schema, "")
    assert missing == []


# ---- bad values are refused ---------------------------------------------------------------------

GOOD = {"database": {"existingSecret": "db"}, "api": {"auth": {"existingSecret": "tokens"}}}


def _merge(base, extra):
    out = yaml.safe_load(yaml.safe_dump(base))
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def test_good_values_render():
    assert len(r.objects(r.render(GOOD))) >= 8


@pytest.mark.parametrize("bad, message", [
    ({"worker": {"replicas": "three"}}, "replicas"),
    ({"worker": {"concurrency": 0}}, "concurrency"),
    ({"worker": {"queues": ["bad queue!"]}}, "queues"),
    ({"worker": {"tasks": []}}, "tasks"),
    ({"worker": {"replica": 2}}, "replica"),
    ({"unknownTopLevel": True}, "unknownTopLevel"),
    ({"api": {"auth": {"tokens": ["ops:root:abc"]}}}, "tokens"),
    ({"config": {"logFormat": "xml"}}, "logFormat"),
    ({"config": {"leaseSeconds": "30"}}, "leaseSeconds"),
    ({"metrics": {"serviceMonitor": {"interval": 30}}}, "interval"),
    ({"scheduler": {"schedules": [{"name": "x", "kind": "k"}]}}, "schedules"),
    ({"database": {"url": "mysql://x"}}, "url"),
])
def test_schema_refuses_bad_values(bad, message):
    import helm_python as helm

    with pytest.raises(helm.HelmError) as info:
        r.render(_merge(GOOD, bad))
    assert message in str(info.value)


@pytest.mark.parametrize("bad, message", [
    ({"worker": {"shutdownGraceSeconds": 30}}, "worker.shutdownGraceSeconds (30) must be < config.leaseSeconds"),
    ({"config": {"leaseSeconds": 20}}, "must be < config.leaseSeconds (20)"),
    ({"scheduler": {"terminationGracePeriodSeconds": 30}}, "scheduler.terminationGracePeriodSeconds (30) must be >"),
    ({"api": {"preStopSleepSeconds": 25}}, "api.terminationGracePeriodSeconds (40) must be > api.preStopSleepSeconds"),
    ({"dispatcher": {"webhook": {"timeoutSeconds": 30}}}, "dispatcher.webhook.leaseSeconds (30) must be > dispatcher.webhook.timeoutSeconds"),
    ({"dispatcher": {"shutdownGraceSeconds": 29, "webhook": {"leaseSeconds": 20}}}, "must be > dispatcher.shutdownGraceSeconds"),
    ({"database": {"existingSecret": ""}}, "database: set database.existingSecret"),
    ({"api": {"auth": {"existingSecret": ""}}}, "api.auth: set"),
    ({"worker": {"autoscaling": {"enabled": True}, "keda": {"enabled": True}}}, "choose one"),
])
def test_relations_between_values_are_refused(bad, message):
    import helm_python as helm

    with pytest.raises(helm.HelmError) as info:
        r.render(_merge(GOOD, bad))
    assert message in str(info.value)


def test_keda_postgresql_query_counts_claimable_and_running_tasks(db_url, db):
    """The ScaledObject's query, run against a real migrated database, counts what the workers
    must handle: claimable and running tasks of their queues, not delayed or paused ones."""
    from skiplock.enqueueing import enqueue

    objs = r.objects(r.render(_merge(GOOD, {"worker": {"queues": ["default", "reports"],
                                                         "keda": {"enabled": True}}})))
    (so,) = r.kind(objs, "ScaledObject")
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "postgresql" and trigger["metadata"]["targetQueryValue"] == "10"
    query = trigger["metadata"]["query"]

    def count():
        return db.execute(query).fetchone()[0]

    assert count() == 0
    for queue in ("default", "default", "reports", "other"):
        enqueue(db_url, "demo.hello", {}, queue=queue)
    enqueue(db_url, "demo.hello", {}, queue="default", delay=3600)
    assert count() == 3  # "other" is not a worker queue; the delayed task is not claimable yet
    db.execute("UPDATE skiplock.tasks SET state = 'running', lease_until = now() + interval '30 s' "
               "WHERE id = (SELECT id FROM skiplock.tasks WHERE queue = 'reports')")
    assert count() == 3  # running tasks still need their pod
    db.execute("INSERT INTO skiplock.pauses (scope, name) VALUES ('queue', 'default')")
    assert count() == 1  # the paused queue's tasks are not claimable

"""The chart renders, lints strict, validates against Kubernetes' schemas, and keeps its
invariants in every ci/*-values.yaml scenario; bad values are refused."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
import tomllib
from urllib.parse import urlsplit

import pytest
import yaml

from tests.chart import rendering as r

pytestmark = pytest.mark.timeout(120)

SCENARIOS = r.SCENARIOS
EXPECTED_SCENARIOS = {"default", "minimal", "production", "ha-hpa", "keda", "everything"}
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


def test_the_schemas_are_the_newest_shipped_and_strict_validation_refuses_a_typo():
    """KUBE_VERSION follows the installed kubernetes-validate (never below its floor), and the
    check above can fail: a misspelt field of a rendered Deployment is refused at that version."""
    import kubernetes_validate

    assert r.KUBE_VERSION == kubernetes_validate.latest_version()
    with pytest.raises(AssertionError, match="below 999.0.0"):
        r.newest_kube_version(floor="999.0.0")
    worker = r.strip_private(r.by_name(r.scenario_objects("default"), "Deployment", "skiplock-worker"))
    kubernetes_validate.validate(worker, r.KUBE_VERSION, strict=True)
    r.pod_spec(worker)["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, r.KUBE_VERSION, strict=True)


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
        assert {o["kind"] for o in crds} == {"PodMonitor", "PrometheusRule", "ScaledObject"}
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
    # only a worker that sets its pod deletion cost talks to the Kubernetes API
    deletion_cost = r.scenario_values(scenario).get("worker", {}).get("podDeletionCost", {}).get("enabled", False)
    mounting = [name for name, spec in pods if spec.get("automountServiceAccountToken") is not False]
    assert mounting == (["Deployment/skiplock-worker"] if deletion_cost else []), mounting


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
    if values.get("postgresql", {}).get("enabled", True):  # on by default
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
    base = {"postgresql": {"enabled": False}, "database": {"url": "postgresql://u:Zx9-unique-pass@db/skiplock"},
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

GOOD = {"postgresql": {"enabled": False}, "database": {"existingSecret": "db"},
        "api": {"auth": {"existingSecret": "tokens"}}}


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
    ({"worker": {"podDeletionCost": {"enable": True}}}, "enable"),
    ({"networkPolicy": {"kubeApiEgress": [{"cidr": "10.0.0.1/32"}]}}, "port"),
    ({"worker": {"claimLanes": -1}}, "claimLanes"),
    ({"api": {"limits": {"maxWaitSeconds": 51}}}, "maxWaitSeconds"),
    ({"api": {"limits": {"maxWaits": -1}}}, "maxWaits"),
    ({"api": {"limits": {"maxFeeds": -1}}}, "maxFeeds"),
])
def test_schema_refuses_bad_values(bad, message):
    import helm_python as helm

    with pytest.raises(helm.HelmError) as info:
        r.render(r.merge(GOOD, bad))
    assert message in str(info.value)


@pytest.mark.parametrize("bad, message", [
    ({"worker": {"shutdownGraceSeconds": 30}}, "worker.shutdownGraceSeconds (30) must be < config.leaseSeconds"),
    ({"config": {"leaseSeconds": 20}}, "must be < config.leaseSeconds (20)"),
    ({"scheduler": {"terminationGracePeriodSeconds": 30}}, "scheduler.terminationGracePeriodSeconds (30) must be >"),
    ({"api": {"preStopSleepSeconds": 25}}, "api.terminationGracePeriodSeconds (40) must be > api.preStopSleepSeconds"),
    ({"dispatcher": {"webhook": {"timeoutSeconds": 30}}}, "dispatcher.webhook.leaseSeconds (30) must be > dispatcher.webhook.timeoutSeconds"),
    ({"dispatcher": {"shutdownGraceSeconds": 29, "webhook": {"leaseSeconds": 20}}}, "must be > dispatcher.shutdownGraceSeconds"),
    ({"database": {"existingSecret": ""}}, "database: set database.existingSecret"),
    ({"postgresql": {"enabled": True}}, "set postgresql.enabled=false"),
    ({"database": {"existingSecret": "", "url": "postgresql://u:Zx9-pass@db/s"}, "postgresql": {"enabled": True}},
     "set postgresql.enabled=false"),
    ({"worker": {"podDeletionCost": {"enabled": True}}, "networkPolicy": {"enabled": True}},
     "set networkPolicy.kubeApiEgress"),
    ({"worker": {"podDeletionCost": {"enabled": True}}, "serviceAccount": {"create": False}},
     "namespace's default ServiceAccount"),
    ({"worker": {"autoscaling": {"enabled": True}, "keda": {"enabled": True}}}, "choose one (KEDA"),
    ({"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
     "choose one (both would scrape every pod twice"),
])
def test_relations_between_values_are_refused(bad, message):
    import helm_python as helm

    with pytest.raises(helm.HelmError) as info:
        r.render(r.merge(GOOD, bad))
    assert message in str(info.value)


def test_keda_postgresql_query_counts_claimable_and_running_tasks(db_url, db):
    """The ScaledObject's query, run against a real migrated database, counts what the workers
    must handle: claimable and running tasks of their queues, not delayed or paused ones."""
    from skiplock.enqueueing import enqueue

    objs = r.objects(r.render(r.merge(GOOD, {"worker": {"queues": ["default", "reports"],
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


# ---- no values: `helm install skiplock charts/skiplock` ------------------------------------------

def _secret_data(objs, name):
    return {k: base64.b64decode(v).decode() for k, v in r.by_name(objs, "Secret", name)["data"].items()}


def test_no_values_run_the_bundled_postgres_and_generate_an_admin_token():
    from skiplock.engine.settings import parse_api_tokens

    assert r.scenario_values("default") == {}
    objs = r.scenario_objects("default")
    (pg,) = r.kind(objs, "StatefulSet")
    assert pg["metadata"]["name"] == "skiplock-postgresql"
    (pg_container,) = r.pod_spec(pg)["containers"]
    assert pg_container["image"].startswith("postgres:")
    (claim,) = pg["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "8Gi"

    # every role reads a URL naming the bundled Postgres, with the password Postgres starts with
    password = _secret_data(objs, "skiplock-postgresql")["password"]
    url = urlsplit(_secret_data(objs, "skiplock-database")["url"])
    assert (url.hostname, url.port, url.username, url.password) == ("skiplock-postgresql", 5432, "skiplock", password)
    assert len(password) == 32 and password.isalnum()
    # the data outlives an uninstall on its PVC: so does its password
    annotations = r.by_name(objs, "Secret", "skiplock-postgresql")["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"

    # the API reads the token list in the format it parses; the user reads the token beside it
    tokens = _secret_data(objs, "skiplock-api-tokens")
    assert sorted(tokens) == ["admin-token", "tokens"]
    (entry,) = parse_api_tokens(tokens["tokens"])
    assert (entry.name, entry.role) == ("admin", "admin")
    assert entry.sha256 == hashlib.sha256(tokens["admin-token"].encode()).hexdigest()
    assert len(tokens["admin-token"]) == 43 and tokens["admin-token"].isalnum()
    api = r.by_name(objs, "Deployment", "skiplock-api")
    (container,) = r.pod_spec(api)["containers"]
    assert r.env_of(container)["SKIPLOCK_API_TOKENS_FILE"] == "/etc/skiplock/api/tokens"
    assert "SKIPLOCK_API_AUTH" not in r.env_of(container)
    volume = next(v for v in r.pod_spec(api)["volumes"] if v["name"] == "api-tokens")
    assert volume["secret"] == {"secretName": "skiplock-api-tokens", "items": [{"key": "tokens", "path": "tokens"}]}


def test_each_offline_render_generates_a_new_token_and_password():
    """Offline renders (helm template, lint, the SDK's Chart.render) have no cluster for `lookup`,
    so each one generates anew; on a cluster, `helm upgrade` finds the Secrets and keeps them. The
    SDK's cluster-aware render needs a reachable API server, which these tests do not have."""
    first, second = (r.objects(r.render({})) for _ in range(2))
    for name, key in (("skiplock-api-tokens", "admin-token"), ("skiplock-postgresql", "password")):
        assert _secret_data(first, name)[key] != _secret_data(second, name)[key], name
    # within one render the token is made once: the API pods' checksum is of the Secret rendered
    api = r.by_name(first, "Deployment", "skiplock-api")
    assert len(api["spec"]["template"]["metadata"]["annotations"]["checksum/api-tokens"]) == 64


def test_the_console_session_key_is_a_generated_secret_of_its_own():
    """Not derived from the tokens (anyone who reads the list could sign sessions): random, its own
    Secret, mounted as SKIPLOCK_CONSOLE_SESSION_KEY_FILE, and the pods roll when it changes."""
    from skiplock.engine.settings import Settings

    first, second = (r.objects(r.render({})) for _ in range(2))
    keys = [_secret_data(objs, "skiplock-console-session") for objs in (first, second)]
    assert [sorted(k) for k in keys] == [["session-key"], ["session-key"]]
    key = keys[0]["session-key"]
    assert len(key) == 43 and key.isalnum() and keys[1]["session-key"] != key  # offline: new each render
    assert key not in _secret_data(first, "skiplock-api-tokens").values()
    api = r.by_name(first, "Deployment", "skiplock-api")
    (container,) = r.pod_spec(api)["containers"]
    path = r.env_of(container)["SKIPLOCK_CONSOLE_SESSION_KEY_FILE"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "console-session")
    volume = next(v for v in r.pod_spec(api)["volumes"] if v["name"] == "console-session")
    assert volume["secret"] == {"secretName": "skiplock-console-session",
                                "items": [{"key": "session-key", "path": "session-key"}]}
    assert (mount["mountPath"], mount["readOnly"]) == ("/etc/skiplock/console", True)
    assert path == "/etc/skiplock/console/session-key"
    assert len(api["spec"]["template"]["metadata"]["annotations"]["checksum/console-session"]) == 64
    # the value the API parses from that file is accepted as a key
    assert Settings(console_session_key=key).console_session_key == key


@pytest.mark.parametrize("values", [{"api": {"auth": {"enabled": False}}},
                                    {"api": {"auth": {"existingSecret": "mine"}}}])
def test_the_console_key_is_generated_whatever_the_tokens(values):
    objs = r.objects(r.render(values))
    assert len(_secret_data(objs, "skiplock-console-session")["session-key"]) == 43


def test_an_existing_console_secret_is_mounted_and_nothing_generated():
    objs = r.objects(r.render({"api": {"console": {"existingSecret": "ops-console", "existingSecretKey": "k"}}}))
    assert [s for s in r.kind(objs, "Secret") if "console" in s["metadata"]["name"]] == []
    api = r.by_name(objs, "Deployment", "skiplock-api")
    volume = next(v for v in r.pod_spec(api)["volumes"] if v["name"] == "console-session")
    assert volume["secret"] == {"secretName": "ops-console", "items": [{"key": "k", "path": "session-key"}]}
    with pytest.raises(Exception, match="existingSecretKey"):
        r.render({"api": {"console": {"existingSecretKey": ""}}})
    with pytest.raises(Exception, match="sessionKey"):
        r.render({"api": {"console": {"sessionKey": "typed-in-the-values"}}})


@pytest.mark.parametrize("auth, secrets, env", [
    ({"tokens": ["ops:admin:" + "a" * 64, "ci:submitter:" + "b" * 64]}, {"tokens"}, "SKIPLOCK_API_TOKENS_FILE"),
    ({"existingSecret": "mine"}, None, "SKIPLOCK_API_TOKENS_FILE"),
    ({"enabled": False}, None, "SKIPLOCK_API_AUTH"),
])
def test_a_token_is_generated_only_when_auth_is_on_and_none_is_given(auth, secrets, env):
    objs = r.objects(r.render({"api": {"auth": auth}}))
    rendered = [s for s in r.kind(objs, "Secret") if s["metadata"]["name"] == "skiplock-api-tokens"]
    if secrets is None:
        assert rendered == []
    else:
        (secret,) = rendered
        assert set(secret["data"]) == secrets
        assert base64.b64decode(secret["data"]["tokens"]).decode().splitlines() == auth["tokens"]
    (container,) = r.pod_spec(r.by_name(objs, "Deployment", "skiplock-api"))["containers"]
    assert env in r.env_of(container)
    if env == "SKIPLOCK_API_AUTH":
        assert r.env_of(container)[env] == "disabled"


def test_no_values_notes_warn_about_the_bundled_postgres_and_print_a_working_token_command(tmp_path):
    rendered = r.render({})
    notes = rendered["skiplock/templates/NOTES.txt"]
    assert "WARNING: the database is the BUNDLED POSTGRES, for TRYING SKIPLOCK OUT ONLY." in notes
    assert "--set postgresql.enabled=false --set database.existingSecret=" in notes
    assert "ci/production-values.yaml" in notes
    assert "image skiplock:0.1.0" in notes
    (command,) = re.findall(r'"\$\((kubectl .*)\)"', notes)
    m = re.fullmatch(r"kubectl -n (\S+) get secret (\S+) -o jsonpath='([^']+)' \| base64 -d", command)
    assert m, command
    namespace, name, jsonpath = m.groups()
    assert namespace == r.NAMESPACE and name == "skiplock-api-tokens"
    token = _secret_data(r.objects(rendered), name)["admin-token"]

    # the same jsonpath and base64 pipe, run by the real kubectl on an object holding the same data
    # (client-side only: kubectl's dry run builds the Secret without a cluster)
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing"
    (tmp_path / "kubeconfig").write_text("")
    secret_args = " ".join(f"--from-literal={k}={v}" for k, v in _secret_data(r.objects(rendered), name).items())
    done = subprocess.run(
        ["sh", "-c", f"{kubectl} create secret generic {name} {secret_args} --dry-run=client "
                     f"-o jsonpath='{jsonpath}' | base64 -d"],
        capture_output=True, text=True, timeout=60, env={"KUBECONFIG": str(tmp_path / "kubeconfig"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout == token, done.stderr


def test_production_values_name_everything_and_generate_nothing():
    objs = r.scenario_objects("production")
    values = r.scenario_values("production")
    assert values["postgresql"]["enabled"] is False
    assert r.kind(objs, "StatefulSet") == [] and r.kind(objs, "Secret") == []
    assert _database_secret_of(objs) == (values["database"]["existingSecret"], values["database"]["existingSecretKey"])
    notes = r.render(values)["skiplock/templates/NOTES.txt"]
    assert "BUNDLED POSTGRES" not in notes and "generated" not in notes
    pdbs = {p["metadata"]["name"] for p in r.kind(objs, "PodDisruptionBudget")}
    assert pdbs == {f"skiplock-{role}" for role in r.ROLES}
    assert {d["metadata"]["name"]: d["spec"].get("replicas") for d in r.kind(objs, "Deployment")} == {
        "skiplock-api": 3, "skiplock-worker": None, "skiplock-scheduler": 2, "skiplock-dispatcher": 2}
    (scaled,) = r.kind(objs, "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] >= 2


def _database_secret_of(objs):
    volume = next(v for v in r.pod_spec(r.by_name(objs, "Deployment", "skiplock-worker"))["volumes"]
                  if v["name"] == "database")
    (item,) = volume["secret"]["items"]
    return volume["secret"]["secretName"], item["key"]


# ---- the image a user builds is the image the chart runs ------------------------------------------

def test_the_default_image_is_the_one_skaffold_and_a_user_build():
    version = tomllib.loads((r.ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((r.CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    defaults = yaml.safe_load((r.CHART / "values.yaml").read_text())["image"]
    (artifact,) = yaml.safe_load((r.ROOT / "skaffold.yaml").read_text())["build"]["artifacts"]
    assert artifact["image"] == defaults["repository"] == "skiplock"
    assert artifact["docker"]["dockerfile"] == "docker/Dockerfile"

    objs = r.scenario_objects("default")
    images = {c["image"] for o in objs if r.pod_spec(o) and o["kind"] != "StatefulSet"
              for c in r.pod_spec(o)["containers"] + r.pod_spec(o).get("initContainers", [])}
    assert images == {f"skiplock:{version}"}
    pushed = r.objects(r.render({"image": {"repository": "registry.example.com/skiplock"}}))
    worker = r.pod_spec(r.by_name(pushed, "Deployment", "skiplock-worker"))
    assert worker["containers"][0]["image"] == f"registry.example.com/skiplock:{version}"


# ---- pod deletion cost: the workers' RBAC -----------------------------------------------------------

def test_pod_deletion_cost_grants_workers_get_and_patch_on_pods_in_the_namespace_only():
    objs = r.scenario_objects("everything")
    (role,) = r.kind(objs, "Role")
    (binding,) = r.kind(objs, "RoleBinding")
    assert r.kind(objs, "ClusterRole") == [] and r.kind(objs, "ClusterRoleBinding") == []
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == r.NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    worker = r.pod_spec(r.by_name(objs, "Deployment", "skiplock-worker"))
    (sa,) = r.kind(objs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": worker["serviceAccountName"],
                                    "namespace": r.NAMESPACE}]
    assert sa["metadata"]["name"] == worker["serviceAccountName"] and sa["automountServiceAccountToken"] is False

    # the worker mounts the token and knows its pod; no other pod does either
    assert worker["automountServiceAccountToken"] is True
    (container,) = worker["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SKIPLOCK_POD_DELETION_COST"]["value"] == "true"
    assert env["SKIPLOCK_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["SKIPLOCK_POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    others = [o for o in objs if r.pod_spec(o) and o["metadata"]["name"] != "skiplock-worker"]
    assert len(others) >= 6
    for other in others:
        spec = r.pod_spec(other)
        assert spec.get("automountServiceAccountToken") is False, other["metadata"]["name"]
        for c in spec["containers"] + spec.get("initContainers", []):
            assert not {e["name"] for e in c.get("env", [])} & {"SKIPLOCK_POD_DELETION_COST", "SKIPLOCK_POD_NAME"}
    for init in worker["initContainers"]:
        assert "SKIPLOCK_POD_DELETION_COST" not in r.env_of(init)

    # the workers' NetworkPolicy lets them reach the API server, and only the workers'
    values = r.scenario_values("everything")["networkPolicy"]["kubeApiEgress"]
    api_rules = [{"to": [{"ipBlock": {"cidr": e["cidr"]}}], "ports": [{"protocol": "TCP", "port": e["port"]}]}
                 for e in values]
    for policy in r.kind(objs, "NetworkPolicy"):
        has = [rule for rule in policy["spec"]["egress"] if rule in api_rules]
        assert has == (api_rules if policy["metadata"]["name"] == "skiplock-worker" else []), policy["metadata"]["name"]


def test_pod_deletion_cost_off_renders_no_rbac_and_mounts_no_token():
    for scenario in ("default", "minimal"):
        objs = r.scenario_objects(scenario)
        assert [o["kind"] for o in objs if o["kind"] in ("Role", "RoleBinding")] == []
        worker = r.pod_spec(r.by_name(objs, "Deployment", "skiplock-worker"))
        assert worker["automountServiceAccountToken"] is False
        env = r.env_of(worker["containers"][0])
        assert not {"SKIPLOCK_POD_DELETION_COST", "SKIPLOCK_POD_NAME", "SKIPLOCK_POD_NAMESPACE"} & set(env)


def test_long_poll_bounds_reach_the_api():
    def api_env(values):
        objs = r.objects(r.render(values))
        return r.env_of(r.pod_spec(r.by_name(objs, "Deployment", "skiplock-api"))["containers"][0])

    default = api_env(GOOD)
    assert (default["SKIPLOCK_API_MAX_WAIT_SECONDS"], default["SKIPLOCK_API_MAX_WAITS"],
            default["SKIPLOCK_API_MAX_FEEDS"]) == ("20", "2", "2")
    changed = api_env(r.merge(GOOD, {"api": {"limits": {"maxWaitSeconds": 0, "maxWaits": 3, "maxFeeds": 0}}}))
    assert (changed["SKIPLOCK_API_MAX_WAIT_SECONDS"], changed["SKIPLOCK_API_MAX_WAITS"],
            changed["SKIPLOCK_API_MAX_FEEDS"]) == ("0", "3", "0")


def test_claim_lanes_reach_the_workers_only_when_set():
    default = r.pod_spec(r.by_name(r.objects(r.render(GOOD)), "Deployment", "skiplock-worker"))
    assert "SKIPLOCK_CLAIM_LANES" not in r.env_of(default["containers"][0])  # 0: the worker's own default
    objs = r.objects(r.render(r.merge(GOOD, {"worker": {"claimLanes": 2}})))
    worker = r.pod_spec(r.by_name(objs, "Deployment", "skiplock-worker"))
    assert r.env_of(worker["containers"][0])["SKIPLOCK_CLAIM_LANES"] == "2"


# ---- guards around exposure and egress ------------------------------------------------------------

INSECURE_INGRESS = {"api": {"auth": {"enabled": False}, "ingress": {"enabled": True}}}


def test_auth_off_behind_an_ingress_fails_the_render_in_one_line():
    import helm_python as helm

    with pytest.raises(helm.HelmError) as info:
        r.render(r.merge(GOOD, INSECURE_INGRESS))
    message = str(info.value)
    assert "api.auth.enabled=false with api.ingress.enabled=true" in message and "api.auth.allowInsecure=true" in message
    line = next(line for line in message.splitlines() if "api.auth.allowInsecure" in line)
    assert "api.auth.enabled=false" in line


def test_auth_off_behind_an_ingress_renders_when_allowed_and_warns():
    rendered = r.render(r.merge(GOOD, r.merge(INSECURE_INGRESS, {"api": {"auth": {"allowInsecure": True}}})))
    assert any(o["kind"] == "Ingress" for o in r.objects(rendered))
    assert "whoever reaches\nthe Ingress is admin" in rendered["skiplock/templates/NOTES.txt"]
    # auth off without an Ingress (a port-forward) stays a plain render
    r.render(r.merge(GOOD, {"api": {"auth": {"enabled": False}}}))


def test_an_ingress_without_tls_warns_in_the_notes():
    notes = r.render(r.merge(GOOD, {"api": {"ingress": {"enabled": True}}}))["skiplock/templates/NOTES.txt"]
    assert "WARNING: the Ingress skiplock-api has no TLS" in notes
    with_tls = {"api": {"ingress": {"enabled": True, "tls": [{"secretName": "api-tls",
                                                               "hosts": ["skiplock.example.com"]}]}}}
    assert "has no TLS" not in r.render(r.merge(GOOD, with_tls))["skiplock/templates/NOTES.txt"]
    assert "has no TLS" not in r.render(GOOD)["skiplock/templates/NOTES.txt"]


def _dispatcher_egress(values: dict) -> list[dict]:
    (policy,) = [o for o in r.objects(r.render(values))
                 if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "skiplock-dispatcher"]
    return policy["spec"]["egress"]


def test_dispatcher_egress_admits_allowed_networks_web_ports_and_public_ipv6():
    values = r.merge(GOOD, {"networkPolicy": {"enabled": True},
                           "dispatcher": {"webhook": {"allowedNetworks": ["10.20.0.0/16", "fd00:1::/64"],
                                                      "allowedPorts": "443,8443"}}})
    egress = _dispatcher_egress(values)
    by_cidr = {rule["to"][0]["ipBlock"]["cidr"]: rule for rule in egress if "ipBlock" in rule["to"][0]}
    for cidr in ("10.20.0.0/16", "fd00:1::/64"):
        ports = {(p["port"], p.get("endPort")) for p in by_cidr[cidr]["ports"]}
        assert ports == {(80, None), (443, None), (1024, 65535)}
        assert "except" not in by_cidr[cidr]["to"][0]["ipBlock"]
    assert {p["port"] for p in by_cidr["0.0.0.0/0"]["ports"]} == {80, 443}
    assert "10.0.0.0/8" in by_cidr["0.0.0.0/0"]["to"][0]["ipBlock"]["except"]
    assert {p["port"] for p in by_cidr["2000::/3"]["ports"]} == {80, 443}
    assert "2002::/16" in by_cidr["2000::/3"]["to"][0]["ipBlock"]["except"]
    env = {}
    for o in r.objects(r.render(values)):
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "skiplock-dispatcher":
            env = {e["name"]: e.get("value") for e in o["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SKIPLOCK_WEBHOOK_ALLOWED_PORTS"] == "443,8443"
    assert env["SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS"] == "10.20.0.0/16,fd00:1::/64"


def test_bad_allowed_ports_are_refused_by_the_schema():
    import helm_python as helm

    with pytest.raises(helm.HelmError):
        r.render(r.merge(GOOD, {"dispatcher": {"webhook": {"allowedPorts": "http"}}}))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_api_probes_go_to_the_masters_listener(scenario):
    """The API's probes use SKIPLOCK_METRICS_PORT, which gunicorn's master serves (api/probes.py),
    not the port whose request threads slow or heavy clients can take; the limits reach the env."""
    for dep in r.kind(r.scenario_objects(scenario), "Deployment"):
        main = r.pod_spec(dep)["containers"][0]
        if main["name"] != "api":
            continue
        env = r.env_of(main)
        ports = {p["name"]: p["containerPort"] for p in main["ports"]}
        assert ports["metrics"] == int(env["SKIPLOCK_METRICS_PORT"]) != ports["http"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert main[probe]["httpGet"]["port"] == "metrics", probe
        for name in ("SKIPLOCK_API_SUBMIT_CONCURRENCY", "SKIPLOCK_API_SUBMIT_RATE", "SKIPLOCK_API_SUBMIT_BURST",
                     "SKIPLOCK_API_LARGE_BODIES", "SKIPLOCK_API_MAX_CONNECTIONS",
                     "SKIPLOCK_API_HEADER_TIMEOUT_SECONDS", "SKIPLOCK_API_BODY_TIMEOUT_SECONDS"):
            assert float(env[name]) >= 0, name

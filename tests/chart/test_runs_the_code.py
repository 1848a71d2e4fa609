"""The chart really runs the code: every rendered Deployment's container and the migration Job,
started as local processes with their rendered command, args and env (database URL pointed at the
test database, ports moved to free local ones), become ready on the probe port and path the
manifest declares, do their job, and exit 0 on SIGTERM within terminationGracePeriodSeconds.
The dashboard's PromQL is checked against what those processes really export."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import urllib.request

import psycopg
import pytest

from tests.chart import rendering as r
from tests.chart.local_pods import localize
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(180)

# the ci scenarios that name these tokens by their SHA-256; minimal uses an existing Secret
ADMIN_TOKEN = "ci-admin-token"
EXTERNAL_SECRETS = {
    "skiplock-api-tokens": {"tokens": f"ops:admin:{hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}"},
}


def _admin_token(objs):
    """The token a user of this render holds: the one the chart generated into its Secret (read as
    the NOTES tell), else the one the ci values name by its SHA-256."""
    for secret in r.kind(objs, "Secret"):
        if "admin-token" in secret.get("data", {}):
            return base64.b64decode(secret["data"]["admin-token"]).decode()
    return ADMIN_TOKEN


def _main_container(dep):
    (c,) = r.pod_spec(dep)["containers"]
    return c


def _database_secret(objs):
    dep = r.kind(objs, "Deployment")[0]
    volume = next(v for v in r.pod_spec(dep)["volumes"] if v["name"] == "database")
    return volume["secret"]["secretName"]


def _start_all(objs, tmp_path, db_url):
    secret = _database_secret(objs)
    running = {}
    for dep in r.kind(objs, "Deployment"):
        role = dep["metadata"]["labels"]["app.kubernetes.io/component"]
        running[role] = localize(objs, dep, _main_container(dep), tmp_path, db_url=db_url,
                                 database_secret=secret, provided_secrets=EXTERNAL_SECRETS).start()
    return running


def _get(port, path, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, resp.read()


def exported_metric_names(body: str) -> set[str]:
    """Names a scrape can be queried by: samples, and families declared by # TYPE (a labelled
    family with no sample yet is still exported); histograms add _bucket, _sum, _count."""
    names = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "histogram":
                names.update({name + "_bucket", name + "_sum", name + "_count"})
            if kind == "counter" and not name.endswith("_total"):
                names.add(name + "_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.parametrize("scenario", ["default", "minimal", "everything"])
def test_rendered_workloads_run_become_ready_and_stop_on_sigterm(scenario, db_url, db, store, tmp_path):
    from skiplock.engine.limits import Limit, apply_limits

    objs = r.scenario_objects(scenario)
    secret = _database_secret(objs)
    # a limit set by hand before the release: the scheduler's limits file deletes it only with limitsPrune
    stray = Limit.build("demo.stray", concurrency=3)
    apply_limits(store, [stray])

    # the migration Job: applies (here: finds nothing pending in the migrated database), exits 0
    (job,) = r.kind(objs, "Job")
    migrate = localize(objs, job, r.pod_spec(job)["containers"][0], tmp_path, db_url=db_url, database_secret=secret)
    assert migrate.run_to_end(timeout=job["spec"]["activeDeadlineSeconds"]) == 0, migrate.log()
    assert "up to date" in migrate.log()

    deployments = r.kind(objs, "Deployment")
    roles = sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments)
    assert roles == sorted(["api", "dispatcher", "scheduler", "worker"])

    # every init container finds the schema current and lets its pod start
    for dep in deployments:
        (init,) = r.pod_spec(dep)["initContainers"]
        waiter = localize(objs, dep, init, tmp_path, db_url=db_url, database_secret=secret)
        assert waiter.run_to_end(timeout=30) == 0, waiter.log()

    running = _start_all(objs, tmp_path, db_url)
    try:
        for proc in running.values():
            proc.wait_ready(timeout=40)
            assert proc.probe("livenessProbe") == 200

        # the api answers an authenticated call with the token the values name, or with the one
        # the chart generated when they name none
        api = running["api"]
        token = _admin_token(objs)
        assert (token != ADMIN_TOKEN) == (scenario == "default")
        try:
            status, body = _get(api.ports["http"], "/v1/queues", token=token)
        except urllib.error.HTTPError:
            raise
        except OSError as exc:  # ready, yet its port does not answer: say what the process did
            state = "running" if api.popen.poll() is None else f"exited {api.popen.returncode}"
            raise AssertionError(f"the ready api's port {api.ports['http']} failed: {exc} ({state}):\n"
                                 f"{api.log()[-4000:]}") from exc
        assert status == 200, body
        with pytest.raises(urllib.error.HTTPError) as wrong:
            _get(api.ports["http"], "/v1/queues", token=token + "x")
        assert wrong.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as denied:
            _get(api.ports["http"], "/v1/queues")
        assert denied.value.code == 401
        # the console signs sessions with the key the chart mounted (without one its pages answer 503)
        status, body = _get(api.ports["http"], "/ui/login")
        assert status == 200 and b'name="token"' in body

        # the worker runs a task of the module the values name
        from skiplock.enqueueing import enqueue

        ids = [enqueue(db_url, "demo.hello", {"name": f"chart-{i}"}) for i in range(3)]
        wait_for(lambda: db.execute("SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'completed'",
                                    (ids,)).fetchone()[0] == 3, 30, message="3 demo tasks completed")

        # the scheduler applied the schedules the values render into its ConfigMap
        expected = [s["name"] for s in r.scenario_values(scenario).get("scheduler", {}).get("schedules", [])]
        applied = [row[0] for row in db.execute("SELECT name FROM skiplock.schedules ORDER BY name")]
        assert applied == sorted(expected)

        # and the limits: every limit the values name is in the table the workers' claims read
        values = r.scenario_values(scenario).get("scheduler", {})
        expected_limits = [Limit.from_mapping(e) for e in values.get("limits", [])]
        if not values.get("limitsPrune"):
            expected_limits.append(stray)
        limits = [record.limit for record in store.limits.limit_list()]
        assert sorted(limits, key=lambda x: x.kind) == sorted(expected_limits, key=lambda x: x.kind)
        assert (scenario == "everything") == bool(values.get("limits"))  # so the file path is exercised

        # the `helm test` pod's check passes against this api (its Service name is the one change)
        tests = [p for p in r.kind(objs, "Pod") if p["metadata"]["annotations"].get("helm.sh/hook") == "test"]
        assert len(tests) == 1
        (test_container,) = tests[0]["spec"]["containers"]
        service = f"{r.by_name(objs, 'Service', 'skiplock-api')['metadata']['name']}:8080"
        test_container["command"] = [a.replace(service, f"127.0.0.1:{api.ports['http']}")
                                     for a in test_container["command"]]
        helm_test = localize(objs, tests[0], test_container, tmp_path, db_url=db_url, database_secret=secret)
        assert helm_test.run_to_end(timeout=30) == 0, helm_test.log()
    finally:
        results = {}
        for role, proc in running.items():
            if proc.popen.poll() is None:
                results[role] = proc.terminate()
        for proc in running.values():
            proc.kill()
    assert sorted(results) == roles
    for role, (code, seconds) in results.items():
        assert code == 0, f"{role} exited {code}:\n{running[role].log()[-3000:]}"
        assert seconds < running[role].termination_grace


def test_deployments_wait_until_the_job_has_migrated(pg_server_url, tmp_path):
    """On an empty database the init container keeps waiting; the Job migrates; the init
    container then lets the pod start, and the Job run again changes nothing."""
    name = f"skiplock_chart_empty_{abs(hash(str(tmp_path))) % 10**8}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    info = psycopg.conninfo.conninfo_to_dict(pg_server_url)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**info)
    waiter = None
    try:
        objs = r.scenario_objects("minimal")
        secret = _database_secret(objs)
        worker = r.by_name(objs, "Deployment", "skiplock-worker")
        (init,) = r.pod_spec(worker)["initContainers"]
        waiter = localize(objs, worker, init, tmp_path, db_url=url, database_secret=secret).start()
        wait_for(lambda: waiter.log().count("pending: ") >= 2, 20, message="the init container checked twice")
        assert waiter.popen.poll() is None, "the init container let the pod start on an unmigrated database"

        (job,) = r.kind(objs, "Job")
        migrate = localize(objs, job, r.pod_spec(job)["containers"][0], tmp_path / "job", db_url=url,
                           database_secret=secret)
        assert migrate.run_to_end(timeout=60) == 0, migrate.log()
        applied = migrate.log().count("applied: ")
        assert applied == len(list((r.ROOT / "migrations").glob("*.sql")))

        assert waiter.popen.wait(15) == 0, waiter.log()
        again = localize(objs, job, r.pod_spec(job)["containers"][0], tmp_path / "again", db_url=url,
                         database_secret=secret)
        assert again.run_to_end(timeout=60) == 0 and "applied: " not in again.log()
    finally:
        if waiter is not None:
            waiter.kill()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _dashboard_exprs():
    dash = json.loads((r.CHART / "dashboards" / "skiplock.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def _grafana_to_promql(expr: str) -> str:
    """Grafana's variables, replaced as Grafana would before sending the query."""
    out = expr.replace("$__rate_interval", "5m")
    out = out.replace('"$namespace"', '"skiplock"').replace('"$queue"', '".*"')
    m = re.fullmatch(r"label_values\((.*),\s*\w+\)", out)
    return m.group(1) if m else out


def test_dashboard_queries_parse():
    exprs = _dashboard_exprs()
    assert len(exprs) >= 20
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs it"
    import tempfile

    import yaml

    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": _grafana_to_promql(e)} for i, e in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as fh:
        yaml.safe_dump(rules, fh)
        fh.flush()
        done = subprocess.run([promtool, "check", "rules", fh.name], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_names_only_metrics_the_services_export(db_url, tmp_path):
    import promql_parser

    objs = r.scenario_objects("everything")
    running = _start_all(objs, tmp_path, db_url)
    exported: set[str] = set()
    try:
        for role, proc in running.items():
            proc.wait_ready(timeout=40)
            port = proc.ports.get("metrics") or proc.ports["http"]
            if role == "api":
                # one request on the API's own port, so its series exist on the metrics port too
                _get(proc.ports["http"], "/v1/queues", token=_admin_token(objs))
            status, body = _get(port, "/metrics")
            assert status == 200
            exported |= exported_metric_names(body.decode())
    finally:
        for proc in running.values():
            if proc.popen.poll() is None:
                proc.terminate()
            proc.kill()

    used: set[str] = set()
    for expr in _dashboard_exprs():
        def visit(node):
            if isinstance(node, promql_parser.VectorSelector):
                used.add(node.name)
        promql_parser.walk(promql_parser.parse(_grafana_to_promql(expr)), visit)
    assert len(used) >= 20
    assert used - exported == set(), f"the dashboard queries metrics nobody exports: {sorted(used - exported)}"
    # and the alert rules too
    rules = r.objects(r.render({"postgresql": {"enabled": False}, "database": {"existingSecret": "db"},
                                "api": {"auth": {"existingSecret": "t"}},
                                "metrics": {"prometheusRule": {"enabled": True}}}))
    alert_names: set[str] = set()
    for rule in r.kind(rules, "PrometheusRule")[0]["spec"]["groups"][0]["rules"]:
        promql_parser.walk(promql_parser.parse(rule["expr"]),
                           lambda n: alert_names.add(n.name) if isinstance(n, promql_parser.VectorSelector) else None)
    assert alert_names and alert_names - exported == set(), sorted(alert_names - exported)

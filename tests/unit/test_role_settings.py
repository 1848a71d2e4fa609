"""Each role sees only the variables it declares it reads (engine/settings: every Variable names its
roles). A role's config holds exactly those fields, and the role's code reads no other: this test
walks each role package for attribute reads on its settings (`settings.x`, `self.settings.x`,
`api().settings.x`) and fails on a name its config does not hold. Declaring the read, in the
variable's `roles`, is the fix; so is not reading it."""

from __future__ import annotations

import ast
import re
import dataclasses
from pathlib import Path

import pytest

from skiplock.engine import settings
from skiplock.engine.settings import ROLE_SETTINGS, ROLES, VARIABLES, Settings, declared_by
from tests.support.harness import ROOT

PACKAGE = ROOT / "services" / "skiplock"
# the code of each role: its package, and the engine's modules that read the settings it is given
# (run_role's store and metrics port; the webhook address guard)
ROLE_CODE = {"worker": ("worker", "engine/lifecycle.py"), "scheduler": ("scheduler", "engine/lifecycle.py"),
             "dispatcher": ("dispatcher", "engine/lifecycle.py", "engine/webhooks.py"),
             "api": ("api", "engine/webhooks.py")}


def _is_settings(node: ast.AST, aliases: set[str]) -> bool:
    """`settings`, `<...>.settings`, a name bound to one of those, or `XSettings.of(...)`."""
    if isinstance(node, ast.Name):
        return node.id == "settings" or node.id in aliases
    if isinstance(node, ast.Attribute):
        return node.attr == "settings"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "of"
            and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("Settings"))


def settings_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of each `<...>settings.<name>` in the source: the name read on a variable or an
    attribute called `settings`, or on a name the module binds to one (`s = self.settings`)."""
    tree = ast.parse(source)
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and _is_settings(node.value, aliases)):
            aliases.add(node.targets[0].id)
    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _is_settings(node.value, aliases)]


def readable(role: str) -> set[str]:
    """What a role may read on its config: its fields, and the config's own methods and properties."""
    cls = ROLE_SETTINGS[role]
    return {f.name for f in dataclasses.fields(cls)} | {name for name in dir(cls) if not name.startswith("_")}


def undeclared_reads(role: str, *code: Path) -> list[str]:
    allowed = readable(role)
    found = []
    for place in code:
        for path in sorted(place.rglob("*.py")) if place.is_dir() else [place]:
            for line, name in settings_reads(path.read_text()):
                if name not in allowed:
                    found.append(f"{path.name}:{line}: settings.{name}")
    return found


@pytest.mark.parametrize("role", sorted(ROLE_CODE))
def test_a_role_reads_only_the_variables_it_declares(role):
    assert undeclared_reads(role, *(PACKAGE / place for place in ROLE_CODE[role])) == [], (
        f"the {role} reads a variable it does not declare: add {role!r} to the variable's roles "
        "(engine/settings/) or read it elsewhere")


def test_the_walk_finds_a_read_of_another_roles_variable(tmp_path):
    """The check itself: a worker module that reads a dispatcher's variable is reported."""
    (tmp_path / "stray.py").write_text("def f(self, settings):\n"
                                       "    s = self.settings\n"
                                       "    return settings.concurrency, self.settings.webhook_concurrency, s.api_auth\n")
    assert sorted(r.split(": ", 1)[1] for r in undeclared_reads("worker", tmp_path)) == [
        "settings.api_auth", "settings.webhook_concurrency"]


@pytest.mark.parametrize("role", sorted(ROLE_SETTINGS))
def test_a_role_config_holds_exactly_its_declared_variables(role):
    cls = ROLE_SETTINGS[role]
    assert [f.name for f in dataclasses.fields(cls)] == [v.field for v in declared_by(role)]
    assert cls.__dataclass_params__.frozen


def test_every_parsed_variable_is_read_by_a_role():
    for v in VARIABLES:
        assert set(v.roles) <= set(ROLES), v.name
        assert bool(v.roles) == v.parsed, f"{v.name}: a parsed variable names the roles that read it"


def test_a_role_config_has_no_other_roles_variable():
    """Built from the full settings, a role's config answers its own variables and refuses others."""
    full = Settings.from_env({"SKIPLOCK_CONCURRENCY": "3", "SKIPLOCK_WEBHOOK_CONCURRENCY": "5"})
    worker, dispatcher = full.worker(), full.dispatcher()
    assert worker.concurrency == 3 and dispatcher.webhook_concurrency == 5
    assert worker.db_schema == dispatcher.db_schema == "skiplock"  # every role's holds the database's
    with pytest.raises(AttributeError):
        worker.webhook_concurrency
    with pytest.raises(AttributeError):
        dispatcher.concurrency
    with pytest.raises(AttributeError):
        full.scheduler().api_tokens
    with pytest.raises(dataclasses.FrozenInstanceError):
        worker.concurrency = 4


def test_a_role_built_from_its_own_variables_only():
    """The environment of one role (its variables and the database's) builds the same config as
    the full settings do: a role needs nothing else set."""
    env = {"SKIPLOCK_DATABASE_URL": "postgresql://u@h/db", "SKIPLOCK_QUEUES": "a,b", "SKIPLOCK_API_MAX_WAITS": "1",
           "SKIPLOCK_RETAIN_AUDIT_SECONDS": "60", "SKIPLOCK_WEBHOOK_MAX_ATTEMPTS": "3"}
    full = Settings.from_env(env)
    for role, cls in ROLE_SETTINGS.items():
        own = {f"{settings.PREFIX}{v.name}" for v in declared_by(role)}
        alone = Settings.from_env({k: v for k, v in env.items() if k in own})
        assert cls.of(alone) == cls.of(full), role
        config = cls.of(full)
        assert cls.of(config) is config


# ---- the chart sets a role's variables only -------------------------------------------------------

CHART = ROOT / "charts" / "skiplock" / "templates"
_ENV_NAME = re.compile(r"-\s+name:\s+SKIPLOCK_([A-Z0-9_]+)")


def _chart_env(template: Path) -> set[str]:
    names = set(_ENV_NAME.findall(template.read_text()))
    return {name.removesuffix("_FILE") if name.endswith("_FILE") and name[:-5] in settings.BY_NAME else name
            for name in names}


@pytest.mark.parametrize("role", ["worker", "scheduler", "dispatcher", "api"])
def test_the_chart_sets_only_variables_its_role_reads(role):
    """Each Deployment's container env names variables the role declares (a `_FILE` one counts as
    its variable); the env every role gets (_helpers.tpl) names declared variables."""
    declared = {v.name for v in declared_by(role)}
    assert _chart_env(CHART / role / "deployment.yaml") - declared == set()
    assert _chart_env(CHART / "_helpers.tpl") - set(settings.BY_NAME) == set()


def test_a_role_config_built_directly_is_checked_as_settings_are():
    from skiplock.engine.errors import ConfigError
    from skiplock.engine.settings import DispatcherSettings, WorkerSettings

    with pytest.raises(ConfigError, match="SKIPLOCK_CONCURRENCY=0: must be a positive integer"):
        WorkerSettings(concurrency=0)
    with pytest.raises(ConfigError, match="SKIPLOCK_HEARTBEAT_SECONDS=20: must be > 0 and <= lease/3"):
        WorkerSettings(heartbeat_seconds=20.0)
    with pytest.raises(ConfigError, match="SKIPLOCK_WEBHOOK_TIMEOUT_SECONDS=40: must be < SKIPLOCK_WEBHOOK_LEASE"):
        DispatcherSettings(webhook_timeout_seconds=40.0)
    assert WorkerSettings() == Settings().worker()

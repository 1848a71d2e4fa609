"""Settings: every knob comes from SKIPLOCK_* environment variables, parsed once into a frozen
dataclass and validated when built. A bad value fails at startup with the variable's name.

`NAME_FILE` may hold the path of a file whose content is the value (Kubernetes secrets).
This package reads the environment only when `Settings.from_env()` is called.

Each variable is declared once, as a `Variable` in the module of the role that owns it (shared.py:
the database, logs and what several roles read; worker.py, scheduler.py, dispatcher.py, api.py).
From the declarations come:
  - `Settings`, every variable's field, for the CLI and `skiplock dev` (which runs every role);
    from_env() parses each declared variable, and building it checks each one's bound or choices,
    then each module's `check_relations` (one variable against another);
  - one frozen config per role (`WorkerSettings`, `SchedulerSettings`, `DispatcherSettings`,
    `ApiSettings`) and `DatabaseSettings`: the fields of the variables whose `roles` name it (every
    role's holds the database's), checked as Settings checks them. A role builds its own from the
    settings it is given
    (`WorkerSettings.of(settings)`) and keeps only that, so reading a variable it does not declare
    fails (tests/unit/test_role_settings.py checks each role's code for it);
  - the docs' tables (scripts/gen_docs.py, from VARIABLES).

Adding a variable: one `Variable` in the module of the role that reads it (its `roles` name every
role that does; `contract=N` puts it at row N of docs/CONTRACT.md, the rows after it move down
one), a relation in that module's `check_relations` if it has one, then `python scripts/gen_docs.py`.
The fields are generated, so a static type checker does not see them; the tests read them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from . import api, dispatcher, scheduler, shared, worker
from .api import (API_MAX_WAIT_CEILING, API_ROLES, API_WORKER_TIMEOUT_SECONDS, CONSOLE_SESSION_KEY_MIN_CHARS, ApiToken,
                  parse_api_tokens)
from .declaration import BY_NAME, GROUPS, PREFIX, ROLES, Bound, EnvReader, Variable, declared_default, register
from .shared import NAME_RE, POOLERS, SCHEMA_RE, DatabaseMethods, check_name, check_pooler
from .worker import CLAIM_LANES_MAX

__all__ = ["API_MAX_WAIT_CEILING", "API_ROLES", "API_WORKER_TIMEOUT_SECONDS", "ApiSettings", "ApiToken",
           "BY_NAME", "Bound", "CLAIM_LANES_MAX", "CONSOLE_SESSION_KEY_MIN_CHARS", "DatabaseSettings",
           "DispatcherSettings", "EnvReader", "GROUPS", "NAME_RE", "POOLERS", "PREFIX", "ROLES",
           "ROLE_SETTINGS", "SCHEMA_RE", "SchedulerSettings", "Settings", "VARIABLES", "Variable",
           "WorkerSettings", "check_name", "check_pooler", "declared_by", "declared_default",
           "parse_api_tokens"]

# every variable; each group's rows in docs/CONFIGURATION.md come in this order
VARIABLES: tuple[Variable, ...] = (shared.VARIABLES + worker.VARIABLES + scheduler.VARIABLES
                                   + dispatcher.VARIABLES + api.VARIABLES)
register(VARIABLES)
_PARSED = tuple(v for v in VARIABLES if v.parsed)
# one variable against another, after each one's own check; by the role whose config holds them all
_RELATIONS = {"worker": worker.check_relations, "dispatcher": dispatcher.check_relations}


def _check(config, variables, relations) -> None:
    for variable in variables:
        variable.check(getattr(config, variable.field))
    for check in relations:
        check(config)


def _fields(variables) -> list:
    return [(v.field, v.annotation, dataclasses.field(default=v.field_default(), repr=not v.secret))
            for v in variables]


class _SettingsMethods(DatabaseMethods):
    def __post_init__(self) -> None:
        _check(self, _PARSED, _RELATIONS.values())

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "Settings":
        env = EnvReader(os.environ if environ is None else environ)
        values = {v.field: v.read(env) for v in _PARSED if v.derive is None}
        values.update({v.field: v.read(env, v.derive(values)) for v in _PARSED if v.derive is not None})
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def database(self) -> "DatabaseSettings":
        return DatabaseSettings.of(self)

    def worker(self) -> "WorkerSettings":
        return WorkerSettings.of(self)

    def scheduler(self) -> "SchedulerSettings":
        return SchedulerSettings.of(self)

    def dispatcher(self) -> "DispatcherSettings":
        return DispatcherSettings.of(self)

    def api(self) -> "ApiSettings":
        return ApiSettings.of(self)


Settings = dataclasses.make_dataclass("Settings", _fields(_PARSED), bases=(_SettingsMethods,), frozen=True,
                                      namespace={"__module__": __name__})
Settings.__doc__ = "Every variable's value, checked: what the CLI and `skiplock dev` read."


class _RoleMethods(DatabaseMethods):
    """A role's view of the settings: only the variables it declares it reads."""

    ROLE = ""

    def __post_init__(self) -> None:
        # built from checked settings this passes; built directly, it checks what Settings would
        _check(self, declared_by(self.ROLE), [check for role, check in _RELATIONS.items() if role == self.ROLE])

    @classmethod
    def of(cls, settings):
        """The role's fields of `settings` (a Settings, already checked, or this config itself)."""
        if isinstance(settings, cls):
            return settings
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)})

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def declared_by(role: str) -> tuple[Variable, ...]:
    """The variables the role's config holds: its own and, for every role, the database's."""
    return tuple(v for v in _PARSED if role in v.roles or "database" in v.roles)


def _role_settings(name: str, role: str):
    cls = dataclasses.make_dataclass(name, _fields(declared_by(role)), bases=(_RoleMethods,), frozen=True,
                                     namespace={"ROLE": role, "__module__": __name__})
    cls.__doc__ = f"The variables the {role} reads (engine/settings: each Variable's roles)."
    return cls


DatabaseSettings = _role_settings("DatabaseSettings", "database")
WorkerSettings = _role_settings("WorkerSettings", "worker")
SchedulerSettings = _role_settings("SchedulerSettings", "scheduler")
DispatcherSettings = _role_settings("DispatcherSettings", "dispatcher")
ApiSettings = _role_settings("ApiSettings", "api")
ROLE_SETTINGS = {cls.ROLE: cls for cls in (DatabaseSettings, WorkerSettings, SchedulerSettings,
                                           DispatcherSettings, ApiSettings)}

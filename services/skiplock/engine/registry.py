"""The handler registry behind `@skiplock.task`: task kinds and how to run them.

Decorating (skiplock/handles.py) registers the function in the process-wide REGISTRY (the worker
imports the modules named in SKIPLOCK_TASKS and reads it). A kind declared with `payload=` (a
pydantic model) is a TypedTaskDef: engine/payload_types.py holds all that knows pydantic (it
imports pydantic only for such a kind).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Iterable

from .errors import ConfigError, InvalidInput
from .model import TaskDef
from .payload_types import MODELS


class Registry:
    def __init__(self, payload_models: dict[str, type] | None = None) -> None:
        self._defs: dict[str, TaskDef] = {}
        # kind -> pydantic model of the typed kinds; the process's REGISTRY fills the one
        # engine/payload_types.py looks up at enqueue
        self.payload_models: dict[str, type] = {} if payload_models is None else payload_models

    def add(self, definition: TaskDef) -> None:
        existing = self._defs.get(definition.kind)
        if existing is not None and existing.fn is not definition.fn:
            same_place = (getattr(existing.fn, "__module__", None), getattr(existing.fn, "__qualname__", None)) == \
                (getattr(definition.fn, "__module__", None), getattr(definition.fn, "__qualname__", None))
            if not same_place:  # a module imported twice (e.g. as __main__) redefines the same kind
                raise InvalidInput(f"task kind {definition.kind!r} is defined twice")
        self._defs[definition.kind] = definition
        model = getattr(definition, "payload_model", None)
        if model is not None:
            self.payload_models[definition.kind] = model
        else:  # redefined without one
            self.payload_models.pop(definition.kind, None)

    def get(self, kind: str) -> TaskDef | None:
        return self._defs.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._defs)

    def __len__(self) -> int:
        return len(self._defs)


REGISTRY = Registry(MODELS)


def queue_of(kind: str, queue: str | None = None) -> str:
    """The queue an enqueue of `kind` uses: `queue` when given, else the queue @task declared for
    the kind where this process knows its definition (its tasks module is imported: the worker,
    the API with SKIPLOCK_TASKS, an application that imported it), else `default`."""
    if queue is not None:
        return queue
    definition = REGISTRY.get(kind)
    return definition.queue if definition is not None else "default"


def import_task_modules(modules: Iterable[str]) -> None:
    """Import the modules named in SKIPLOCK_TASKS so their @task decorators register.

    The current directory comes first on sys.path, as with `python -m` (and Celery, PgQueuer):
    the `skiplock` console script's own sys.path[0] is its bin directory, so without this a
    `myapp/tasks.py` next to the user would not be found. It stays there afterwards, because
    handlers may import more of the user's modules when they run.
    """
    modules = list(modules)
    cwd = os.getcwd()
    if modules and cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):  # it, or a parent
                raise ConfigError(f"SKIPLOCK_TASKS: cannot import {name!r}: no module {exc.name!r} in the current "
                                  f"directory ({cwd}) or the installed packages") from None
            raise ConfigError(f"SKIPLOCK_TASKS: cannot import {name!r}: {_where(exc)}") from None
        except Exception as exc:  # the module itself fails (syntax, a name error, a bad @task): say where
            raise ConfigError(f"SKIPLOCK_TASKS: cannot import {name!r}: {_where(exc)}") from None


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` of where an import failed, on one line."""
    if isinstance(exc, SyntaxError):  # raised by the compiler: no frame of the module to point at
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}:{exc.lineno})"
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # [0] is import_task_modules() itself
    outside = [f for f in frames if "importlib" not in f.filename]
    if outside:
        return f"{text} ({outside[-1].filename}:{outside[-1].lineno})"
    return text

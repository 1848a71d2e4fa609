"""How a SKIPLOCK_* variable is declared, read and checked: `Variable` (one per variable, in the
module of the role that owns it), `EnvReader` (typed reads with `NAME_FILE` support) and the bounds
a declaration names, which build the one-line error naming the variable.

This module knows no variable: the role modules beside it declare them. It reads the environment
only through an EnvReader it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from ..errors import ConfigError

PREFIX = "SKIPLOCK_"
# an EnvReader read given no default: the variable's declared one
_DECLARED = object()
# the roles whose config a variable can be in (engine/settings/__init__.py builds one config per role)
ROLES = ("database", "worker", "scheduler", "dispatcher", "api", "dev")
EVERY_ROLE = ("worker", "scheduler", "dispatcher", "api", "dev")

# the headings of docs/CONFIGURATION.md, in its order
ANY = "Every role"
WORKER = "Worker"
SCHEDULER = "Scheduler"
DISPATCHER = "Dispatcher (webhooks)"
API = "API"
POD = "Worker pods on Kubernetes"
DEV = "Development"
GROUPS = (ANY, WORKER, SCHEDULER, DISPATCHER, API, POD, DEV)


class Bound(NamedTuple):
    """A bound on a number: `low` (`>` when `open`, else `>=`) and optionally `high` (`<=`).

    `says` is the text after `must be ` in the error; the declarations spell the texts the contract
    has always printed (`a positive integer`, `> 0`, `0-65535`, `>= 0 (0: no limit)`)."""

    low: float
    says: str
    open: bool = False
    high: float | None = None

    def admits(self, value: float) -> bool:
        above = value > self.low if self.open else value >= self.low
        return above and (self.high is None or value <= self.high)


def positive(kind: str = "number") -> Bound:
    """> 0: `a positive integer` for counts, `> 0` for durations."""
    return Bound(0, "a positive integer" if kind == "integer" else "> 0", open=True)


def at_least_zero(note: str = "") -> Bound:
    return Bound(0, f">= 0 {note}".strip())


def port() -> Bound:
    return Bound(0, "0-65535", high=65535)


class Variable(NamedTuple):
    """One SKIPLOCK_* variable: how from_env() reads it, what it admits, which roles read it, and
    what the docs' configuration tables say about it (scripts/gen_docs.py writes them)."""

    name: str                 # without the SKIPLOCK_ prefix; its settings field is name.lower(), or field_name
    default: object           # when unset (a settings field built directly gets it too)
    meaning: str              # one line of Markdown
    group: str                # its heading in docs/CONFIGURATION.md
    roles: tuple[str, ...] = ()  # the role configs that hold it (ROLES); () only for parsed=False
    kind: str = "text"        # text, number, integer, boolean, names: the EnvReader method
    type: str = ""            # the settings field's annotation, where the kind does not say it
    convert: Callable[[object], object] | None = None  # after the read (lower-casing, parsing a list)
    bound: Bound | None = None   # checked on the converted value; the error names the variable
    choices: tuple[str, ...] = ()  # the value must be one of these; `says` the error's text
    says: str = ""            # the error's text after `must be ` for choices
    checker: Callable[["Variable", object], None] | None = None  # a check of its own (a pattern)
    derive: Callable[[dict], object] | None = None  # from_env()'s default from other values (lease / 3)
    shown: str | None = None  # the default as the tables show it, where the value does not say it
    more: str = ""            # what docs/CONFIGURATION.md adds to the meaning
    contract: int = 0         # its row in docs/CONTRACT.md (1 first); 0: not in the contract
    readme: int = 0           # its row in the README's table; 0: not there
    parsed: bool = True       # read by Settings.from_env(); False: read where it is used
    exact: bool = False       # the error prints the value as read (`30.0`), not shortened (`30`)
    secret: bool = False      # kept out of the settings' repr (a key, not a credential's hash)
    field_name: str = ""      # the settings field, where the contract's name is not the code's word

    @property
    def field(self) -> str:
        return self.field_name or self.name.lower()

    @property
    def annotation(self) -> str:
        return self.type or _ANNOTATIONS[self.kind]

    @property
    def env(self) -> str:
        return PREFIX + self.name

    def field_default(self):
        """The settings field's default: the declared one, through `convert` (a list parsed)."""
        return self.convert(self.default) if self.convert else self.default

    def read(self, env: "EnvReader", default=_DECLARED):
        value = getattr(env, self.kind)(self.name, self.default if default is _DECLARED else default)
        return self.convert(value) if self.convert else value

    def check(self, value) -> None:
        """ConfigError naming the variable when `value` is outside the declared bound or choices."""
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.env}={value!r}: must be {self.says}")
        if self.bound is not None and not self.bound.admits(value):
            shown = value if self.exact or not isinstance(value, float) else f"{value:g}"
            raise ConfigError(f"{self.env}={shown}: must be {self.bound.says}")
        if self.checker is not None:
            self.checker(self, value)


_ANNOTATIONS = {"text": "str | None", "number": "float", "integer": "int", "boolean": "bool",
                "names": "tuple[str, ...]"}


# every declared variable by name, filled by the package from the role modules' declarations
BY_NAME: dict[str, Variable] = {}


def register(variables: tuple[Variable, ...]) -> None:
    for variable in variables:
        if BY_NAME.setdefault(variable.name, variable) is not variable:
            raise LookupError(f"{variable.env} is declared twice")


def declared_default(name: str, default=_DECLARED):
    """`default` if given, else the one the declarations give SKIPLOCK_<name>."""
    if default is not _DECLARED:
        return default
    try:
        return BY_NAME[name].default
    except KeyError:
        raise LookupError(f"{PREFIX}{name} is read with no default and not declared in VARIABLES") from None


class EnvReader:
    """Typed reads of SKIPLOCK_* variables, with NAME_FILE support. A read without a default takes
    the declared one."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ

    def raw(self, name: str) -> str | None:
        key = PREFIX + name
        path = self.environ.get(key + "_FILE")
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    return fh.read().strip()
            except OSError as exc:
                raise ConfigError(f"{key}_FILE={path}: cannot read ({exc.strerror})") from exc
        value = self.environ.get(key)
        return None if value is None or value.strip() == "" else value.strip()

    def text(self, name: str, default=_DECLARED):
        value = self.raw(name)
        return declared_default(name, default) if value is None else value

    def number(self, name: str, default: float = _DECLARED) -> float:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        try:
            parsed = float(value)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={value!r}: not a number") from None
        if parsed != parsed or parsed in (float("inf"), float("-inf")):
            raise ConfigError(f"{PREFIX}{name}={value!r}: not a finite number")
        return parsed

    def integer(self, name: str, default: int = _DECLARED) -> int:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={value!r}: not an integer") from None

    def boolean(self, name: str, default: bool = _DECLARED) -> bool:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{PREFIX}{name}={value!r}: must be true or false")

    def names(self, name: str, default: tuple[str, ...] = _DECLARED) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return declared_default(name, default)
        return tuple(part.strip() for part in value.split(",") if part.strip())

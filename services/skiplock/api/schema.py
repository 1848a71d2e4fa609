"""The shapes of what the API reads and writes, declared once: each field validates a decoded
JSON value (or a query-string value) with a message naming the field, and describes itself as
the JSON Schema the OpenAPI document publishes. So the document and the validation cannot drift.

Also the query string, checked against such fields. Reading the body itself (its size, its
JSON) is request_body.py's. Nothing here knows about routes, auth or the database.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any

from ..engine.errors import InvalidInput
from ..engine.settings import NAME_RE

# Times outside these years are refused: Python cannot read some of them back from Postgres.
_MIN_YEAR, _MAX_YEAR = 1970, 9998

_MISSING = object()


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class Field:
    """One value. `parse(value, path)` returns it validated (or raises InvalidInput naming
    `path`); `from_text()` does the same for a query-string value."""

    json_type = ""

    def __init__(self, description: str = "", *, nullable: bool = False, default: Any = _MISSING,
                 example: Any = _MISSING):
        self.description, self.nullable, self.default, self.example = description, nullable, default, example

    def parse(self, value: Any, path: str) -> Any:
        if value is None:
            if self.nullable:
                return None
            raise InvalidInput(f"{path}: must not be null")
        return self.check(value, path)

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def from_text(self, text: str, path: str) -> Any:
        return self.parse(text, path)

    def json_schema(self) -> dict:
        schema = {"type": self.json_type} if self.json_type else {}
        schema.update(self.constraints())
        if self.nullable:
            schema["nullable"] = True
        if self.description:
            schema["description"] = self.description
        if self.default is not _MISSING:
            schema["default"] = self.default
        if self.example is not _MISSING:
            schema["example"] = self.example
        return schema

    def constraints(self) -> dict:
        return {}


class String(Field):
    json_type = "string"

    def __init__(self, description: str = "", *, min_length: int = 0, max_length: int | None = None,
                 pattern: str | None = None, enum: tuple[str, ...] | None = None, **kwargs):
        super().__init__(description, **kwargs)
        self.min_length, self.max_length, self.enum = min_length, max_length, enum
        self.pattern = pattern
        self._regex = re.compile(pattern) if pattern else None

    def check(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise InvalidInput(f"{path}: must be a string, not {type_name(value)}")
        if "\x00" in value:  # Postgres text cannot hold NUL
            raise InvalidInput(f"{path}: must not contain a NUL character")
        if self.enum is not None and value not in self.enum:
            raise InvalidInput(f"{path} {_describe(value)}: must be one of {', '.join(self.enum)}")
        if len(value) < self.min_length or (self.max_length is not None and len(value) > self.max_length):
            bounds = f"{self.min_length}-{self.max_length}" if self.max_length is not None else f">= {self.min_length}"
            raise InvalidInput(f"{path}: must be {bounds} characters long (got {len(value)})")
        # the whole value: `$` alone would admit a trailing newline ("q1\n")
        if self._regex is not None and not self._regex.fullmatch(value):
            raise InvalidInput(f"{path} {_describe(value)}: {self.pattern_help()}")
        return value

    def pattern_help(self) -> str:
        return f"must match {self.pattern}"

    def constraints(self) -> dict:
        out: dict[str, Any] = {}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.min_length:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.pattern:
            out["pattern"] = self.pattern
        return out


class Name(String):
    """A queue, kind, schedule or token name (engine/settings.NAME_RE)."""

    def __init__(self, description: str = "", **kwargs):
        super().__init__(description, min_length=1, max_length=64, pattern=NAME_RE.pattern, **kwargs)

    def pattern_help(self) -> str:
        return "use 1-64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit"


class Uuid(String):
    def __init__(self, description: str = "", **kwargs):
        super().__init__(description, **kwargs)

    def check(self, value: Any, path: str) -> uuid.UUID:
        text = super().check(value, path)
        try:
            return uuid.UUID(text)
        except ValueError:
            raise InvalidInput(f"{path} {_describe(text)}: not a UUID") from None

    def constraints(self) -> dict:
        return {"format": "uuid"}


class DateTime(String):
    """An RFC 3339 time with a UTC offset; returned as an aware datetime."""

    def check(self, value: Any, path: str) -> dt.datetime:
        text = super().check(value, path)
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(f"{path} {_describe(text)}: not an ISO 8601 time") from None
        if parsed.tzinfo is None:
            raise InvalidInput(f"{path} {_describe(text)}: add a UTC offset, e.g. 2030-01-01T09:00:00Z")
        try:
            utc = parsed.astimezone(dt.timezone.utc)
        except OverflowError:
            utc = None
        if utc is None or not _MIN_YEAR <= utc.year <= _MAX_YEAR:
            raise InvalidInput(f"{path} {_describe(text)}: must be between the years {_MIN_YEAR} and {_MAX_YEAR}")
        return utc

    def constraints(self) -> dict:
        return {"format": "date-time"}


class Integer(Field):
    json_type = "integer"
    _TEXT = re.compile(r"[+-]?[0-9]{1,20}")

    def __init__(self, description: str = "", *, minimum: int | None = None, maximum: int | None = None, **kwargs):
        super().__init__(description, **kwargs)
        self.minimum, self.maximum = minimum, maximum

    def check(self, value: Any, path: str) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 3.0 is an integer in JSON's eyes
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(f"{path}: must be an integer, not {type_name(value)}")
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise InvalidInput(f"{path} {value}: must be {self._range()}")
        return value

    def _range(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"in [{self.minimum}, {self.maximum}]"
        return f">= {self.minimum}" if self.minimum is not None else f"<= {self.maximum}"

    def from_text(self, text: str, path: str) -> int:
        if not self._TEXT.fullmatch(text):
            raise InvalidInput(f"{path} {_describe(text)}: must be an integer")
        return self.parse(int(text), path)

    def constraints(self) -> dict:
        out = {}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


class Number(Integer):
    json_type = "number"

    def check(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidInput(f"{path}: must be a finite number, not {type_name(value)}")
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise InvalidInput(f"{path} {value:g}: must be {self._range()}")
        return float(value)

    def from_text(self, text: str, path: str) -> float:
        try:
            return self.parse(float(text), path)
        except ValueError:
            raise InvalidInput(f"{path} {_describe(text)}: must be a number") from None


class Boolean(Field):
    json_type = "boolean"

    def check(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise InvalidInput(f"{path}: must be true or false, not {type_name(value)}")
        return value


class JsonObject(Field):
    """Any JSON object (a task payload): contents are the caller's."""

    json_type = "object"

    def check(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            raise InvalidInput(f"{path}: must be a JSON object, not {type_name(value)}")
        return value

    def constraints(self) -> dict:
        return {"additionalProperties": True}


class JsonValue(Field):
    """Any JSON value (results, cursors, event data): documented, never parsed from input."""

    def check(self, value: Any, path: str) -> Any:
        return value

    def json_schema(self) -> dict:
        schema = super().json_schema()
        schema.pop("nullable", None)  # without a type, null is already allowed
        return schema


class Array(Field):
    json_type = "array"

    def __init__(self, items: Field, description: str = "", *, min_items: int = 0, max_items: int | None = None,
                 **kwargs):
        super().__init__(description, **kwargs)
        self.items, self.min_items, self.max_items = items, min_items, max_items

    def check(self, value: Any, path: str) -> list:
        if not isinstance(value, list):
            raise InvalidInput(f"{path}: must be an array, not {type_name(value)}")
        if len(value) < self.min_items or (self.max_items is not None and len(value) > self.max_items):
            bounds = f"{self.min_items}-{self.max_items}" if self.max_items is not None else f">= {self.min_items}"
            raise InvalidInput(f"{path}: must hold {bounds} items (got {len(value)})")
        return [self.items.parse(item, f"{path}[{i}]") for i, item in enumerate(value)]

    def constraints(self) -> dict:
        out: dict[str, Any] = {"items": self.items.json_schema()}
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


class Object(Field):
    """A JSON object with known fields; unknown fields are refused, not ignored (a typo would
    otherwise be a silent no-op). Parsing returns a dict of the fields given, plus defaults."""

    json_type = "object"

    def __init__(self, fields: Mapping[str, Field], description: str = "", *, required: tuple[str, ...] = (),
                 **kwargs):
        super().__init__(description, **kwargs)
        self.fields, self.required = dict(fields), required

    def check(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            raise InvalidInput(f"{path}: must be a JSON object, not {type_name(value)}")
        unknown = sorted(set(value) - set(self.fields))
        if unknown:
            raise InvalidInput(f"{self._at(path, unknown[0])}: unknown field (known: {', '.join(self.fields)})")
        out = {}
        for name, field in self.fields.items():
            if name in value:
                out[name] = field.parse(value[name], self._at(path, name))
            elif name in self.required:
                raise InvalidInput(f"{self._at(path, name)}: required")
            elif field.default is not _MISSING:
                out[name] = field.default
        return out

    @staticmethod
    def _at(path: str, name: str) -> str:
        return f"{path}.{name}" if path else name

    def constraints(self) -> dict:
        out: dict[str, Any] = {"properties": {name: f.json_schema() for name, f in self.fields.items()},
                               "additionalProperties": False}
        if self.required:
            out["required"] = list(self.required)
        return out


# ---- query strings ---------------------------------------------------------------------------

def parse_query(fields: Mapping[str, Field], args) -> dict[str, Any]:
    """Query-string parameters (anything with `getlist`: a request's args, the CLI's options)
    against `fields`: unknown or repeated parameters are refused; absent ones default (or None)."""
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise InvalidInput(f"{unknown[0]}: unknown query parameter (known: {', '.join(fields) or 'none'})")
    out = {}
    for name, field in fields.items():
        values = args.getlist(name)
        if len(values) > 1:
            raise InvalidInput(f"{name}: give it once, not {len(values)} times")
        if values:
            out[name] = field.from_text(values[0], name)
        else:
            out[name] = None if field.default is _MISSING else field.default
    return out

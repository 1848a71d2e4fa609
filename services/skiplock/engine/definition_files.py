"""The declarative files an operator applies (`skiplock schedules apply -f`, `skiplock limits
apply -f`, the chart's ConfigMaps): YAML (or JSON) holding a list of definitions, or a mapping
with that list under the file's one key. Errors name the file, the entry and the field; nothing
is returned unless every entry is valid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import InvalidInput

T = TypeVar("T")


def load_definitions(path: str, source: str, plural: str, label_field: str,
                     from_mapping: Callable[[Any], T]) -> list[T]:
    """The entries of the file at `path` (named `source` in a read error: `-f`, or the variable
    that gave it), each built by `from_mapping`; `plural` is the list's key and its name in
    messages, `label_field` the field that names an entry in them."""
    import yaml  # only the declarative sync needs it

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise InvalidInput(f"{source} {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if isinstance(data, Mapping) and set(data) <= {plural}:
        data = data.get(plural)
    if data is None:
        return []
    if not isinstance(data, list):
        raise InvalidInput(f"{path}: expected a list of {plural} (or `{plural}:` with a list)")
    entries = []
    for i, entry in enumerate(data):
        label = f"{plural}[{i}]"
        if isinstance(entry, Mapping) and isinstance(entry.get(label_field), str):
            label += f" ({entry[label_field]})"
        try:
            entries.append(from_mapping(entry))
        except InvalidInput as exc:
            raise InvalidInput(f"{path}: {label}: {exc}") from None
    return entries

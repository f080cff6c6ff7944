"""Type checks for JSON read back into tfrun's dataclasses (run_config.json -> TrainConfig), driven by the
dataclass's own annotations so that a new field is checked without more code.

Supported annotations (assert otherwise): str, int, float, bool, dict, list[X], dict[str, X] and `X | None`,
nested. JSON has no int/float distinction for whole numbers, so an int is accepted where a float is
expected; a bool is never a number.

    >>> check_value(3, "list[int] | None", "x")
    Traceback (most recent call last):
    ...
    tfrun.errors.TfrunError: x: must be a list of integers or null, got 3
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from tfplan.fileio import field_name
from tfrun.errors import TfrunError


def _split_union(annotation: str) -> list[str]:
    """'list[int] | None' -> ['list[int]', 'None'] (top-level bars only)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(annotation):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    parts.append(annotation[start:].strip())
    return parts


def _words(annotation: str, plural: bool = False) -> str:
    """An annotation in words, for messages ("a list of lists of strings")."""
    parts = _split_union(annotation)
    if len(parts) > 1:
        return " or ".join(_words(p, plural) for p in parts)
    simple = {"str": ("a string", "strings"), "int": ("an integer", "integers"), "float": ("a number", "numbers"),
              "bool": ("true or false", "booleans"), "dict": ("an object", "objects"), "None": ("null", "nulls"),
              "Any": ("anything", "anything")}
    if annotation in simple:
        return simple[annotation][plural]
    if annotation.startswith("list["):
        return ("lists of " if plural else "a list of ") + _words(annotation[5:-1], True)
    if annotation.startswith("dict[str, "):
        return ("objects of " if plural else "an object of ") + _words(annotation[10:-1], True)
    raise AssertionError(f"unsupported annotation {annotation!r}")


def _matches(value: Any, annotation: str) -> bool:
    parts = _split_union(annotation)
    if len(parts) > 1:
        return any(_matches(value, p) for p in parts)
    if annotation == "None":
        return value is None
    if annotation == "Any":
        return True
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "dict":
        return isinstance(value, dict)
    if annotation.startswith("list["):
        return isinstance(value, list) and all(_matches(x, annotation[5:-1]) for x in value)
    if annotation.startswith("dict[str, "):
        return isinstance(value, dict) and all(isinstance(k, str) and _matches(v, annotation[10:-1])
                                               for k, v in value.items())
    raise AssertionError(f"unsupported annotation {annotation!r}")


def check_value(value: Any, annotation: str, path: str) -> None:
    """Raise TfrunError naming `path` unless `value` (parsed JSON) fits `annotation`."""
    if not _matches(value, annotation):
        text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
        text = text if len(text) <= 40 else text[:37] + "..."
        raise TfrunError(f"{path}: must be {_words(annotation)}, got {text}")


def check_fields(obj: Any, cls: type, what: str) -> dict[str, Any]:
    """Check a parsed JSON object against dataclass `cls`: an object, no unknown field, every field without
    a default present, each value of its annotated type. Returns the object.

    Raises:
        TfrunError: "{what}: unknown field x", "{what}.steps: must be an integer, got "ten"", ...
    """
    if not isinstance(obj, dict):
        raise TfrunError(f"{what}: must be a JSON object, got {type(obj).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in obj:
        if key not in fields:
            raise TfrunError(f"{what}: unknown field {field_name(key)}")
    for name, f in fields.items():
        if name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TfrunError(f"{what}.{name}: missing required field")
            continue
        check_value(obj[name], str(f.type), f"{what}.{name}")
    return obj

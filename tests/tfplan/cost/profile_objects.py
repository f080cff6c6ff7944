"""Profile objects the profile tests edit: a valid per-stage profile (_valid, its stages STAGE) and a copy with
one field changed or removed (_set, DELETE)."""

from __future__ import annotations

import copy
import re

STAGE = {
    "forward_ms": 1.0,
    "backward_ms": 2.0,
    "backward_frozen_ms": 1.0,
    "backward_input_ms": 1.0,
    "backward_weight_ms": 1.0,
    "backward_weight_frozen_ms": 0.0,
}


def _valid(n: int = 3) -> dict:
    return {
        "schema_version": 1,
        "name": "t",
        "source": {"kind": "hand"},
        "p2p_ms": 0.0,
        "step_overhead_ms": 0.0,
        "stages": [dict(STAGE) for _ in range(n)],
    }


def _set(obj: dict, path: str, value) -> dict:
    """Copy of obj with the dotted/indexed path ('stages[2].backward_ms') set; value DELETE removes it."""
    obj = copy.deepcopy(obj)
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    target = obj
    for part in parts[:-1]:
        target = target[int(part[1:-1])] if part.startswith("[") else target[part]
    last = parts[-1]
    key = int(last[1:-1]) if last.startswith("[") else last
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return obj


DELETE = object()

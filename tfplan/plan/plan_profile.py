"""The profile a plan file carries (docs/formats.md): what a plan keeps of its profile's source when written, and
the section read back into a Profile with errors that name the plan's field (`profile.stages[0].forward_ms`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from tfplan.cost import profile as profile_mod
from tfplan.errors import TfplanError
from tfplan.fileio import field_name
from tfplan.plan.plan_ratios import require

MAX_SOURCE_FIELDS = 64
"""profile.source keeps at most this many fields (a plan records provenance, not the profile's notes)."""


def source_provenance(source: dict[str, Any]) -> dict[str, Any]:
    """The provenance a plan keeps of its profile's source: its scalar fields (nested notes such as measured
    fields or repeats dropped, and numbers that are not finite, which the plan's reader rejects), at most
    MAX_SOURCE_FIELDS of them.

    >>> source_provenance({"kind": "measured", "model": "tiny", "measured_fields": {"0": ["forward_ms"]}, "x": 1e999})
    {'kind': 'measured', 'model': 'tiny'}
    """
    kept = {k: v for k, v in source.items() if isinstance(k, str) and isinstance(v, (str, int, float, bool, type(None)))
            and not (isinstance(v, float) and not math.isfinite(v))}
    return dict(list(kept.items())[:MAX_SOURCE_FIELDS])


def profile_section(prof_obj: dict[str, Any]) -> tuple[profile_mod.Profile, str, dict[str, Any]]:
    """A plan's `profile` object read back: (the Profile its DAG is built from, its hash, its source)."""
    stages = require(prof_obj, "stages", list, "profile.")
    try:
        prof = profile_mod.from_dict({
            "schema_version": profile_mod.SCHEMA_VERSION,
            "name": require(prof_obj, "name", str, "profile."),
            "p2p_ms": prof_obj.get("p2p_ms", 0.0),
            "dispatch_ms": prof_obj.get("dispatch_ms", 0.0),
            "step_overhead_ms": prof_obj.get("step_overhead_ms", 0.0),
            "stages": stages,
        })
    except TfplanError as exc:  # the profile reader names its own fields: here they sit under `profile`
        message = str(exc)
        raise TfplanError(message if message.startswith("profile.") else f"profile.{message}") from None
    return prof, _profile_hash(prof_obj), _source(prof_obj)


def _profile_hash(prof_obj: dict[str, Any]) -> str:
    value = prof_obj.get("hash", "")
    if not isinstance(value, str):
        raise TfplanError(f"profile.hash: must be a string, got {json.dumps(value)}")
    return value


def _source(prof_obj: dict[str, Any]) -> dict[str, Any]:
    """profile.source: optional, an object of at most MAX_SOURCE_FIELDS strings, numbers, booleans or nulls."""
    source = prof_obj.get("source", {})
    if not isinstance(source, dict):
        raise TfplanError("profile.source: must be an object")
    if len(source) > MAX_SOURCE_FIELDS:
        raise TfplanError(f"profile.source: at most {MAX_SOURCE_FIELDS} fields, got {len(source)}")
    for key, value in source.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise TfplanError(f"profile.source.{field_name(key)}: must be finite, got {value}")
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise TfplanError(f"profile.source.{field_name(key)}: must be a string, number, boolean or null")
    return dict(source)

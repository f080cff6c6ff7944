"""summary.json of a tfrun run (docs/formats.md, "Run outputs"): its field types and a validator for the
programs that read it back (`tfplan explain`, `tfrun train`'s table, `tfrun profile`), so a damaged or
hand-edited summary is one clear line, never a KeyError.

A summary is a flat JSON object written by tfrun (tfrun.records.summarize); readers check
the fields they use (`required`) and the type of every known field present. Fields this module does not
know are allowed (newer tfrun versions add fields; readers ignore them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tfplan.errors import TfplanError
from tfplan.fileio import read_json

SCHEMA_VERSION = 6
"""2: schema_version itself, timing_note and prediction_note (version 1 files have no schema_version).
3: tokens, train_wall_s, eval_s, wall_tokens_per_s (wall-time accounting); medians over the steps in force
(an online run's stable phase) and an online run's headline prediction is its first plan's; the noise scale
(noise_scale_tokens, grad_sq_share, noise_steps).
4: noise_estimator (the noise scales' estimator, issue 36); its metrics rows carry lr, grad_norm, and on a step
that was not finite nonfinite and skipped (issue 37), and noise_skipped on a measured step.
5: noise_measure (the noise estimator's small batch: microbatch or sequence, issue 36); a version 4 file's
noise scales are per micro-batch.
6: update_share (the adam learning model's stage weights, issue 45; its metrics rows carry update_norm) and, for
a tied model split over stages, tied_copies_agree (issue 47)."""
READS_VERSIONS = (1, 2, 3, 4, 5, 6)

# Field -> kind: "str", "int" (>= 0), "num" (a number; NaN allowed for medians over nothing), "list[num]",
# "list"; a trailing "?" also allows null.
FIELDS: dict[str, str] = {
    "schema_version": "int",
    "schedule": "str", "model": "str", "freeze": "str", "freeze_method": "str",
    "num_ranks": "int", "num_stages": "int", "num_microbatches": "int", "steps": "int", "timed_steps": "int",
    "step_time_ms": "num", "tokens_per_s": "num", "measured_makespan_ms": "num?", "timing_note": "str?",
    "predicted_step_ms": "num?", "prediction_error": "num?", "prediction_note": "str?",
    "mean_freeze_ratio": "list[num]", "planned_freeze_ratio": "list[num]", "realised_freeze_ratio": "list[num]",
    "min_update_share": "num?", "min_contribution_share": "num?", "longest_update_gap": "int?",
    "final_train_loss": "num?", "final_eval_loss": "num?",
    "phases": "list", "stable_step_time_ms": "num?", "stable_predicted_step_ms": "num?",
    "stable_prediction_error": "num?", "outside_stable_share": "num?", "solve_s": "list[num]", "plans": "list",
    "replans": "int", "dp": "int",
    "tokens": "int", "train_wall_s": "num", "eval_s": "num", "wall_tokens_per_s": "num?",
    "noise_scale_tokens": "list", "grad_sq_share": "list[num]?", "noise_steps": "int", "noise_estimator": "str",
    "noise_measure": "str", "update_share": "list[num]?",
}
REQUIRED = ("schedule", "model", "freeze", "steps", "step_time_ms", "tokens_per_s", "mean_freeze_ratio",
            "final_train_loss")
"""What every tfrun summary has and `tfrun train` prints."""


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(key: str, kind: str, value: Any) -> None:
    if kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    ok = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "num": _is_num,
        "list[num]": lambda v: isinstance(v, list) and all(_is_num(x) for x in v),
        "list": lambda v: isinstance(v, list),
    }[kind](value)
    if not ok:
        words = {"str": "a string", "int": "an integer >= 0", "num": "a number", "list[num]": "a list of numbers",
                 "list": "a list"}[kind]
        raise TfplanError(f"{key}: must be {words}{' or null' if kind != FIELDS[key] else ''}, "
                          f"got {_short(value)}")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def from_dict(obj: Any, required: Iterable[str] = REQUIRED) -> dict[str, Any]:
    """Validate a parsed summary.json object; returns it unchanged.

    Args:
        obj: the parsed JSON.
        required: fields the caller reads (each must be present, and not null).

    Raises:
        TfplanError: naming the field.
    """
    if not isinstance(obj, dict):
        raise TfplanError(f"summary: must be a JSON object, got {type(obj).__name__}")
    version = obj.get("schema_version", 1)
    if type(version) is not int or version not in READS_VERSIONS:
        raise TfplanError(f"schema_version: must be one of {READS_VERSIONS}, got {_short(version)}")
    for key in required:
        assert key in FIELDS, key
        if obj.get(key) is None:
            raise TfplanError(f"{key}: missing required field")
    for key, kind in FIELDS.items():
        if key in obj:
            _check(key, kind, obj[key])
    return obj


def load(path: str | Path, required: Iterable[str] = REQUIRED) -> dict[str, Any]:
    """Read and validate a summary.json.

    Raises:
        TfplanError: missing, unreadable or invalid (naming the file and field).
    """
    obj = read_json(path, "summary")
    try:
        return from_dict(obj, required)
    except TfplanError as exc:
        raise TfplanError(f"{path}: {exc}") from None

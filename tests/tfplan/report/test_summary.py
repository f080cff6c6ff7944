"""summary.json's validator (tfplan.report.summary): what tfrun writes passes, damage is one line naming the field,
and no JSON makes it raise anything but TfplanError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from tests.fuzzing import json_values, mutated
from tfplan.errors import TfplanError
from tfplan.report import summary

VALID = {
    "schema_version": 2, "schedule": "1f1b", "model": "tiny", "freeze": "plan", "freeze_method": "detach",
    "num_ranks": 2, "num_stages": 2, "num_microbatches": 4, "steps": 8, "timed_steps": 7, "timing_note": None,
    "step_time_ms": 101.5, "tokens_per_s": 2500.0, "measured_makespan_ms": float("nan"), "predicted_step_ms": 10.4,
    "prediction_error": 8.7, "prediction_note": None, "mean_freeze_ratio": [0.6, 0.9],
    "planned_freeze_ratio": [0.6, 0.9], "realised_freeze_ratio": [0.6, 0.9], "min_update_share": 1.0,
    "min_contribution_share": 0.3, "longest_update_gap": 0, "final_train_loss": 4.4, "final_eval_loss": None,
}


def test_a_summary_as_tfrun_writes_it_passes(tmp_path) -> None:
    assert summary.from_dict(VALID) is VALID
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(VALID))
    assert summary.load(path)["steps"] == 8
    version_1 = {k: v for k, v in VALID.items() if k not in ("schema_version", "timing_note", "prediction_note")}
    assert summary.from_dict(version_1) == version_1
    assert summary.from_dict(VALID | {"a_newer_field": [1]})  # readers ignore fields they do not know


@pytest.mark.parametrize(("change", "message"), [
    ({"step_time_ms": "fast"}, r'^step_time_ms: must be a number, got "fast"'),
    ({"step_time_ms": None}, r"^step_time_ms: missing required field"),
    ({"steps": -1}, r"^steps: must be an integer >= 0, got -1"),
    ({"steps": True}, r"^steps: must be an integer >= 0, got true"),
    ({"prediction_error": "big"}, r'^prediction_error: must be a number or null, got "big"'),
    ({"mean_freeze_ratio": [0.1, "x"]}, r"^mean_freeze_ratio: must be a list of numbers"),
    ({"schema_version": 7}, r"^schema_version: must be one of \(1, 2, 3, 4, 5, 6\), got 7"),
])
def test_damage_names_the_field(change, message) -> None:
    with pytest.raises(TfplanError, match=message):
        summary.from_dict(VALID | change)


def test_readers_require_only_what_they_read() -> None:
    assert summary.from_dict({"step_time_ms": 3.0}, required=("step_time_ms",))
    with pytest.raises(TfplanError, match="^schedule: missing required field"):
        summary.from_dict({"step_time_ms": 3.0})
    with pytest.raises(TfplanError, match="^summary: must be a JSON object, got list"):
        summary.from_dict([])


@settings(max_examples=300, deadline=None)
@given(mutated(VALID) | json_values)
def test_fuzzed_summaries_raise_only_tfplan_errors(obj) -> None:
    try:
        summary.from_dict(obj)
    except TfplanError:
        pass

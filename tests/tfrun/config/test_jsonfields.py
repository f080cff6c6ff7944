"""run_config.json read back into TrainConfig (tfrun.config.jsonfields): every field type-checked from the dataclass's
annotations, errors naming the field, and no JSON raising anything but TfrunError."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from tests.conftest import torch_or_skip
from tests.fuzzing import json_values, mutated
from tfrun.config.jsonfields import _matches, _words, check_value
from tfrun.config.train_config import TrainConfig
from tfrun.errors import TfrunError

BASE = TrainConfig(order=[["0F0", "0B0"], ["1F0", "1B0"]], num_stages=2, num_microbatches=1, stage_to_rank=[0, 1],
                   ratios={"1B0": 0.5}, plan_profile={"name": "x"}, data_path="x.txt")
VALID = BASE.to_dict()


def test_every_field_annotation_is_supported_and_a_config_round_trips(tmp_path) -> None:
    for f in dataclasses.fields(TrainConfig):
        _words(str(f.type)), _matches(getattr(BASE, f.name), str(f.type))  # asserts on an unsupported one
        assert _matches(getattr(BASE, f.name), str(f.type)), f.name
    assert TrainConfig.from_dict(VALID) == BASE
    BASE.save(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == BASE


@pytest.mark.parametrize(("change", "message"), [
    ({"steps": "ten"}, r'^run config\.steps: must be an integer, got "ten"'),
    ({"steps": 3.0}, r"^run config\.steps: must be an integer, got 3\.0"),
    ({"lr": True}, r"^run config\.lr: must be a number, got true"),
    ({"lr": float("inf")}, r"^run config\.lr: must be a number, got inf"),
    ({"order": [["0F0", 1]]}, r"^run config\.order: must be a list of lists of strings"),
    ({"ratios": {"1B0": "half"}}, r"^run config\.ratios: must be an object of numbers"),
    ({"plan_path": 3}, r"^run config\.plan_path: must be a string or null, got 3"),
    ({"learning_rate": 1}, r"^run config: unknown field learning_rate"),
])
def test_a_wrong_field_is_named(change, message) -> None:
    with pytest.raises(TfrunError, match=message):
        TrainConfig.from_dict(VALID | change)


def test_missing_required_fields_and_non_objects() -> None:
    with pytest.raises(TfrunError, match=r"^run config\.num_stages: missing required field"):
        TrainConfig.from_dict({k: v for k, v in VALID.items() if k != "num_stages"})
    with pytest.raises(TfrunError, match="^run config: must be a JSON object, got str"):
        TrainConfig.from_dict("order")
    with pytest.raises(TfrunError, match=r"^x: must be a list of integers or null, got 3"):
        check_value(3, "list[int] | None", "x")


@settings(max_examples=300, deadline=None)
@given(mutated(VALID) | json_values)
def test_fuzzed_run_configs_raise_only_tfrun_errors(obj) -> None:
    torch_or_skip()  # check() looks up the model table
    try:
        TrainConfig.from_dict(obj).check()
    except TfrunError:
        pass

"""Profiles: validation naming the field path, versions and the noise section, load errors, content hash,
shipped files, hostile input."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import PROFILES
from tests.fuzzing import json_values, mutated
from tests.tfplan.cost.profile_objects import DELETE, STAGE, _set, _valid
from tfplan.cost import profile
from tfplan.cost.profile import COST_FIELDS, StageCost
from tfplan.errors import TfplanError

# (id, path to change, new value, message the error must start with)
BAD = [
    ("unknown top key", "colour", "red", "colour: unknown field"),
    ("unknown stage key", "stages[1].forward_us", 1.0, "stages[1].forward_us: unknown field"),
    ("missing top field", "p2p_ms", DELETE, "p2p_ms: missing required field"),
    ("missing name", "name", DELETE, "name: missing required field"),
    ("missing stage field", "stages[0].backward_weight_ms", DELETE, "stages[0].backward_weight_ms: missing required"),
    ("negative", "stages[2].backward_ms", -1, "stages[2].backward_ms: must be >= 0, got -1"),
    ("negative p2p", "p2p_ms", -0.5, "p2p_ms: must be >= 0, got -0.5"),
    ("negative overhead", "step_overhead_ms", -2, "step_overhead_ms: must be >= 0"),
    ("nan", "stages[0].forward_ms", float("nan"), "stages[0].forward_ms: must be finite"),
    ("inf", "stages[1].backward_input_ms", float("inf"), "stages[1].backward_input_ms: must be finite"),
    ("bool as number", "stages[0].forward_ms", True, "stages[0].forward_ms: must be a number, got true"),
    ("bool p2p", "p2p_ms", False, "p2p_ms: must be a number, got false"),
    ("string number", "stages[1].backward_ms", "2.0", 'stages[1].backward_ms: must be a number, got "2.0"'),
    ("null", "stages[0].forward_ms", None, "stages[0].forward_ms: must be a number, got null"),
    (
        "frozen B above B",
        "stages[1].backward_frozen_ms",
        2.5,
        "stages[1].backward_frozen_ms: must be <= backward_ms (2), got 2.5",
    ),
    (
        "frozen W above W",
        "stages[2].backward_weight_frozen_ms",
        1.5,
        "stages[2].backward_weight_frozen_ms: must be <= backward_weight_ms (1), got 1.5",
    ),
    ("schema 5", "schema_version", 5, "schema_version: must be one of (1, 2, 3, 4), got 5"),
    ("schema string", "schema_version", "1", 'schema_version: must be one of (1, 2, 3, 4), got "1"'),
    ("stages not a list", "stages", {"0": STAGE}, "stages: must be a non-empty list"),
    ("stages empty", "stages", [], "stages: must be a non-empty list"),
    ("stage not an object", "stages[1]", [1, 2, 3], "stages[1]: must be an object, got list"),
    ("name empty", "name", "", "name: must be a non-empty string"),
    ("name of two lines", "name", "a\nb", "name: must be a non-empty string of printable characters (one line)"),
    ("source not an object", "source", "me", "source: must be an object"),
    ("stage name not a string", "stages[0].name", 3, "stages[0].name: must be a string"),
]


@pytest.mark.parametrize(("path", "value", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_validation_error_names_the_field(path: str, value, message: str) -> None:
    with pytest.raises(TfplanError) as info:
        profile.from_dict(_set(_valid(), path, value))
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_both_or_neither_stages_and_layers() -> None:
    both = _valid() | {"layers": [dict(STAGE)]}
    with pytest.raises(TfplanError, match=r"^stages: give exactly one of 'stages' \(per stage\) or 'layers'"):
        profile.from_dict(both)
    neither = _set(_valid(), "stages", DELETE)
    with pytest.raises(TfplanError, match="^stages: give exactly one of"):
        profile.from_dict(neither)


def test_layers_errors_name_layers_path() -> None:
    obj = _set(_valid(), "stages", DELETE) | {"layers": [dict(STAGE), dict(STAGE) | {"forward_ms": -3}]}
    with pytest.raises(TfplanError, match=r"^layers\[1\]\.forward_ms: must be >= 0, got -3"):
        profile.from_dict(obj)
    with pytest.raises(TfplanError, match="^layers: must be a non-empty list"):
        profile.from_dict(obj | {"layers": "x"})


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(TfplanError, match="^profile: must be an object, got list"):
        profile.from_dict([1])


def test_schema_version_true_is_rejected() -> None:
    with pytest.raises(TfplanError, match="^schema_version: must be one of"):
        profile.from_dict(_set(_valid(), "schema_version", True))


def test_zero_times_are_allowed_and_optional_fields_default() -> None:
    obj = _set(_set(_valid(2), "source", DELETE), "step_overhead_ms", DELETE)
    obj["stages"][0] = {f: 0.0 for f in COST_FIELDS}
    prof = profile.from_dict(obj)
    assert prof.source == {} and prof.step_overhead_ms == 0.0
    assert prof.stages[0] == StageCost(**{f: 0.0 for f in COST_FIELDS})


def test_a_step_of_no_time_and_numbers_past_the_limit_are_refused() -> None:
    obj = _valid(2)
    obj["stages"] = [{f: 0.0 for f in COST_FIELDS}] * 2  # (a ZeroDivisionError in the plan's speedup before)
    with pytest.raises(TfplanError, match=r"^stages: every forward_ms and backward_ms is 0"):
        profile.from_dict(obj)
    obj = _valid(2)
    obj["stages"][1]["forward_ms"] = 1e200  # (GLOP failed on it; 1e308 overflowed the simulator's sums)
    with pytest.raises(TfplanError, match=r"^stages\[1\]\.forward_ms: must be at most 1e\+15, got 1e\+200"):
        profile.from_dict(obj)


def test_to_dict_from_dict_round_trip() -> None:
    obj = _valid(2)
    obj["stages"][1] |= {"name": "head", "forward_ms": 1.25}
    obj["p2p_ms"], obj["step_overhead_ms"] = 0.05, 3
    prof = profile.from_dict(obj)
    again = profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert again == prof
    assert prof.stages[1].name == "head" and prof.stages[1].forward_ms == 1.25
    assert prof.step_overhead_ms == 3.0 and isinstance(prof.step_overhead_ms, float)


def _valid_v2(n: int = 2) -> dict:
    obj = _valid(n) | {"schema_version": 2, "dispatch_ms": 0.3}
    obj["stages"] = [dict(STAGE, tail_ms=1.5) for _ in range(n)]
    obj["quality"] = {"steps": 18, "spread": {"0F": 0.02, "1B-frozen": 0.3}, "max_spread": 0.3,
                      "replay_gap": -0.04, "warnings": ["stage 1 B frozen: spread 30% of the median"]}
    return obj


def test_version_2_round_trip_with_dispatch_tails_and_quality() -> None:
    prof = profile.from_dict(_valid_v2())
    assert prof.dispatch_ms == 0.3 and prof.stages[0].tail_ms == 1.5 and prof.quality["replay_gap"] == -0.04
    assert profile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof
    assert prof.to_dict()["schema_version"] == profile.SCHEMA_VERSION == 4 and "noise" not in prof.to_dict()


NOISE = {"noise_scale_tokens": [1800.0, 2400.0], "grad_sq_share": [0.25, 0.75], "microbatch_tokens": 512,
         "source": "measured"}


def test_version_3_round_trip_with_a_noise_section() -> None:
    obj = _valid_v2() | {"schema_version": 3, "noise": NOISE}
    obj["source"] = {"microbatch_size": 4, "seq_len": 128}
    prof = profile.from_dict(obj)
    assert prof.noise.noise_scale_tokens == (1800.0, 2400.0) and prof.noise.microbatch_tokens == 512
    assert profile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof
    with pytest.raises(TfplanError, match=r"^noise: unknown field|^schema_version"):
        profile.from_dict(_valid_v2() | {"noise": NOISE})  # a version-2 profile has no noise section


@pytest.mark.parametrize(("change", "message"), [
    ({"noise_scale_tokens": [1.0, -5.0]}, r"^noise\.noise_scale_tokens\[1\]: must be a finite number >= 0, got -5"),
    ({"noise_scale_tokens": [1.0, float("nan")]}, r"^noise\.noise_scale_tokens\[1\]: must be a finite number"),
    ({"noise_scale_tokens": [1.0]}, r"^noise\.noise_scale_tokens: must list 2 numbers"),
    ({"grad_sq_share": [0.5, 0.6]}, r"^noise\.grad_sq_share: must sum to 1"),
    ({"microbatch_tokens": 256}, r"^noise\.microbatch_tokens: measured for micro-batches of 256 tokens, but"),
    ({"source": "guess"}, r"^noise\.source: must be one of measured, given"),
    ({"batch": 3}, r"^noise\.batch: unknown field"),
])
def test_a_bad_noise_section_names_the_field(change, message) -> None:
    obj = _valid_v2() | {"schema_version": 3, "noise": NOISE | change}
    obj["source"] = {"microbatch_size": 4, "seq_len": 128}
    with pytest.raises(TfplanError, match=message):
        profile.from_dict(obj)
    missing = _valid_v2() | {"schema_version": 3, "noise": {k: v for k, v in NOISE.items() if k != "source"}}
    with pytest.raises(TfplanError, match=r"^noise\.source: missing required field"):
        profile.from_dict(missing)


def test_a_per_layer_noise_section_sums_into_stages() -> None:
    from tfplan.cost.goodput import NoiseModel

    layers = NoiseModel(noise_scale_tokens=(100.0, 300.0, 1000.0), grad_sq_share=(0.5, 0.25, 0.25),
                        microbatch_tokens=8, source="given")
    stages = layers.for_stages([2, 1])
    # stage 0: |G|^2 share 0.75, tr(Sigma) share 0.5 x 100 + 0.25 x 300 = 125 -> noise 125 / 0.75
    assert stages.grad_sq_share == (0.75, 0.25) and stages.noise_scale_tokens == pytest.approx((125 / 0.75, 1000.0))


def test_version_1_still_loads_and_lacks_the_new_fields() -> None:
    prof = profile.from_dict(_valid(1))
    assert prof.dispatch_ms == 0.0 and prof.stages[0].tail_ms == 0.0 and prof.quality is None
    with pytest.raises(TfplanError, match="^dispatch_ms: unknown field"):
        profile.from_dict(_valid(1) | {"dispatch_ms": 0.1})


@pytest.mark.parametrize(("path", "value", "message"), [
    ("dispatch_ms", -1, "dispatch_ms: must be >= 0"),
    ("stages[1].tail_ms", "x", "stages[1].tail_ms: must be a number"),
    ("quality.steps", 1.5, "quality.steps: must be an integer"),
    ("quality.spread.0F", -0.1, "quality.spread.0F: must be >= 0"),
    ("quality.replay_gap", float("nan"), "quality.replay_gap: must be a finite number"),
    ("quality.warnings", ["ok", 3], "quality.warnings: must be a list of strings"),
    ("quality.colour", "red", "quality.colour: unknown field"),
])
def test_version_2_errors_name_the_field(path: str, value, message: str) -> None:
    with pytest.raises(TfplanError) as info:
        profile.from_dict(_set(_valid_v2(), path, value))
    assert str(info.value).startswith(message), str(info.value)


# ---------------------------------------------------------------------------------------------------------
# Loading files


def test_load_missing_file(tmp_path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(TfplanError, match=f"^profile not found: {re.escape(str(path))}$"):
        profile.load(path)


def test_load_invalid_json_gives_line_and_column(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n "schema_version": 1,\n "name": "x",,\n}\n')
    with pytest.raises(TfplanError) as info:
        profile.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: invalid JSON at line 3, column 14: ")
    assert "\n" not in message


def test_load_schema_error_names_file_and_field(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_set(_valid(), "stages[2].forward_ms", -1)))
    with pytest.raises(TfplanError, match=rf"^{re.escape(str(path))}: stages\[2\]\.forward_ms: must be >= 0"):
        profile.load(path)


def test_load_nan_literal_in_file(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_valid()).replace('"p2p_ms": 0.0', '"p2p_ms": NaN'))
    with pytest.raises(TfplanError, match=r"p2p_ms: must be finite, got nan"):
        profile.load(path)


def test_load_a_folder_is_a_user_error(tmp_path) -> None:
    with pytest.raises(TfplanError, match="cannot read profile"):
        profile.load(tmp_path)


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.json")), ids=lambda p: p.name)
def test_shipped_profiles_load(path) -> None:
    prof = profile.load(path)
    assert prof.name == path.stem
    costs = prof.stages if prof.stages is not None else prof.layers
    assert costs
    for c in costs:
        assert c.backward_frozen_ms <= c.backward_ms and c.backward_weight_frozen_ms <= c.backward_weight_ms


def test_shipped_profiles_exist() -> None:
    names = {p.name for p in PROFILES.glob("*.json")}
    assert "toy-uniform-4.json" in names and len(names) >= 2


def test_toy_uniform_profile_is_the_method_toy() -> None:
    prof = profile.load(PROFILES / "toy-uniform-4.json")
    assert prof.p2p_ms == 0.0 and len(prof.stages) == 4
    for c in prof.stages:
        assert (c.forward_ms, c.backward_ms, c.backward_frozen_ms) == (1.0, 2.0, 1.0)
        assert (c.backward_input_ms, c.backward_weight_ms, c.backward_weight_frozen_ms) == (1.0, 1.0, 0.0)


# ---------------------------------------------------------------------------------------------------------
# Content hash


def test_content_hash_is_stable() -> None:
    obj = _valid()
    h = profile.from_dict(obj).content_hash()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", h)
    assert profile.from_dict(copy.deepcopy(obj)).content_hash() == h
    reordered = dict(reversed(list(obj.items())))
    reordered["stages"] = [dict(reversed(list(s.items()))) for s in obj["stages"]]
    assert profile.from_dict(reordered).content_hash() == h
    # ints and floats of the same value are the same profile
    assert profile.from_dict(_set(obj, "stages[0].forward_ms", 1)).content_hash() == h


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("name", "u"),
        ("p2p_ms", 0.1),
        ("step_overhead_ms", 1.0),
        ("stages[2].backward_weight_frozen_ms", 0.5),
        ("stages[0].forward_ms", 1.0 + 1e-12),
        ("source", {"kind": "measured"}),
    ],
)
def test_content_hash_is_sensitive(path: str, value) -> None:
    base = profile.from_dict(_valid()).content_hash()
    assert profile.from_dict(_set(_valid(), path, value)).content_hash() != base


def test_uniform_helper() -> None:
    prof = profile.uniform(3, forward_ms=2.0, p2p_ms=0.5)
    assert prof.p2p_ms == 0.5 and len(prof.stages) == 3
    assert prof.stages[0].forward_ms == 2.0 and prof.stages[2].backward_ms == 2.0


# Hostile input (issue 13): whatever the JSON, only TfplanError.

LAYERED = {k: v for k, v in _valid(3).items() if k != "stages"} | {"layers": _valid(3)["stages"]}


@settings(max_examples=300, deadline=None)
@given(mutated(_valid_v2(3)) | mutated(LAYERED) | json_values)
def test_fuzzed_profiles_raise_only_tfplan_errors(obj) -> None:
    try:
        prof = profile.from_dict(obj)
    except TfplanError:
        return
    again = profile.from_dict(json.loads(json.dumps(prof.to_dict())))  # what loads, round-trips
    assert json.dumps(again.to_dict()) == json.dumps(prof.to_dict())


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_on_disk_are_a_profile_or_one_tfplan_error(tmp_path_factory, data) -> None:
    path = tmp_path_factory.mktemp("p") / "p.json"
    path.write_bytes(data)
    with pytest.raises(TfplanError):
        profile.load(path)

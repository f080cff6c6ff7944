"""Plan files that do not load: errors naming the field (in every version), missing and unreadable files, ratios
freezing cannot use, a bad profile source, and fuzzed plans that raise only one-line TfplanErrors."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import given, settings

from tests.fuzzing import json_values, mutated
from tests.tfplan.plan.toy_plans import _as_version_2
from tfplan.cost import profile
from tfplan.errors import TfplanError
from tfplan.plan import plan as plan_mod
from tfplan.plan import plan_profile
from tfplan.schedule import schedules
from tfplan.solve import solver
from tfplan.step import dag as dag_mod


def _drop(obj: dict, key: str) -> dict:
    obj = copy.deepcopy(obj)
    del obj[key]
    return obj


def _edit(obj: dict, fn) -> dict:
    obj = copy.deepcopy(obj)
    fn(obj)
    return obj


def _freeze_all_of_stage_0(obj: dict) -> None:
    for item in obj["actions"]:
        if item["action"].startswith("0B"):
            item["freeze_ratio"] = 1.0


def _v2(mutate):
    """A mutation of the version-2 form of the plan (the per-action list of versions 1-2)."""
    return lambda o: mutate(_as_version_2(o))


BAD_PLANS = [
    ("missing schedule", lambda o: _drop(o, "schedule"), r"^schedule: missing required field"),
    (
        "missing order",
        lambda o: _edit(o, lambda x: x["schedule"].pop("order")),
        r"^schedule\.order: missing required field",
    ),
    (
        "an action that is not a string",
        lambda o: _edit(o, lambda x: x["schedule"]["order"][1].__setitem__(2, 7)),
        r"^schedule\.order: must be a list of per-rank lists of action strings",
    ),
    (
        "a rank that is a string",
        lambda o: _edit(o, lambda x: x["schedule"]["order"].__setitem__(0, "0F0")),
        r"^schedule\.order: must be a list of per-rank lists of action strings",
    ),
    (
        "bad action string",
        lambda o: _edit(o, lambda x: x["schedule"]["order"][1].__setitem__(2, "1X1")),
        r"^schedule\.order: not a compute action .*'1X1'",
    ),
    (
        "ratio above 1",
        _v2(lambda o: _edit(o, lambda x: x["actions"][9].__setitem__("freeze_ratio", 1.5))),
        r"^actions\[9\]\.freeze_ratio: must be in \[0, 1\], got 1\.5",
    ),
    (
        "negative ratio",
        _v2(lambda o: _edit(o, lambda x: x["actions"][3].__setitem__("freeze_ratio", -0.1))),
        r"^actions\[3\]\.freeze_ratio: must be in \[0, 1\], got -0\.1",
    ),
    (
        "ratio not a number",
        _v2(lambda o: _edit(o, lambda x: x["actions"][2].__setitem__("freeze_ratio", "0.5"))),
        r"^actions\[2\]\.freeze_ratio: wrong type str",
    ),
    ("missing actions", _v2(lambda o: _drop(o, "actions")), r"^actions: missing required field"),
    (
        "an action left out",
        _v2(lambda o: _edit(o, lambda x: x["actions"].pop(5))),
        r"^actions: must list every scheduled action once \(missing \['\d[FB]\d'\]",
    ),
    (
        "an action twice",
        _v2(lambda o: _edit(o, lambda x: x["actions"].append(dict(x["actions"][0])))),
        r"^actions\[64\]\.action: 0F0 listed twice",
    ),
    (
        "action missing its name",
        _v2(lambda o: _edit(o, lambda x: x["actions"][4].pop("action"))),
        r"^actions\[4\]\.action: missing required field",
    ),
    (
        "mean above cap",
        _v2(lambda o: _edit(o, _freeze_all_of_stage_0)),
        r"^mean_freeze_ratio: stage 0 freezes 1 on average, above its cap 0\.9",
    ),
    ("schema_version 4", lambda o: o | {"schema_version": 4}, r"^schema_version: must be 1, 2 or 3, got 4"),
    ("schema_version missing", lambda o: _drop(o, "schema_version"), r"^schema_version: must be 1, 2 or 3, got null"),
    (
        "table ratio above 1",
        lambda o: _edit(o, lambda x: x["freeze_ratio"][1].__setitem__(3, 1.5)),
        r"^freeze_ratio\[1\]\[3\]: must be in \[0, 1\], got 1\.5",
    ),
    (
        "table ratio not a number",
        lambda o: _edit(o, lambda x: x["freeze_ratio"][2].__setitem__(0, "0.5")),
        r"^freeze_ratio\[2\]\[0\]: must be a number, got \"0\.5\"",
    ),
    (
        "table row too short",
        lambda o: _edit(o, lambda x: x["freeze_ratio"][3].pop()),
        r"^freeze_ratio\[3\]: must list one ratio per micro-batch \(8\)",
    ),
    (
        "table without a stage",
        lambda o: _edit(o, lambda x: x["freeze_ratio"].pop()),
        r"^freeze_ratio: must have one row per stage \(4\), got 3",
    ),
    ("missing ratio table", lambda o: _drop(o, "freeze_ratio"), r"^freeze_ratio: missing required field"),
    (
        "table mean above cap",
        lambda o: _edit(o, lambda x: x["freeze_ratio"].__setitem__(0, [1.0] * 8)),
        r"^mean_freeze_ratio: stage 0 freezes 1 on average, above its cap 0\.9",
    ),
    (
        "solver phase missing its objective",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][2].pop("objective")),
        r"^solver\.phases\[2\]\.objective: missing required field",
    ),
    (
        "solver phase missing its gap",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][0].pop("gap")),
        r"^solver\.phases\[0\]\.gap: missing required field",
    ),
    (
        "solver section missing a key",
        lambda o: _edit(o, lambda x: x["solver"].pop("backend")),
        r"^solver\.backend: missing required field",
    ),
    (
        "solver section with an unknown key",
        lambda o: _edit(o, lambda x: x["solver"].__setitem__("engine", "glop")),
        r"^solver\.engine: unknown field",
    ),
    (
        "solver status above its phases",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][1].__setitem__("status", "FEASIBLE")),
        r"^solver\.status: says OPTIMAL but the phases make it FEASIBLE",
    ),
    (
        "solver phase status unknown",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][1].__setitem__("status", "IMPRECISE")),
        r"^solver\.phases\[1\]\.status: must be one of OPTIMAL, FEASIBLE, got \"IMPRECISE\"",
    ),
    (
        "solver phases out of order",
        lambda o: _edit(o, lambda x: x["solver"]["phases"].reverse()),
        r"^solver\.phases: must be the first phases of makespan, total_freeze, even_spread in order",
    ),
    (
        "solver gap negative",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][1].__setitem__("gap", -1.0)),
        r"^solver\.phases\[1\]\.gap: must be finite and >= 0, got -1",
    ),
    (
        "solver section not an object",
        lambda o: o | {"solver": [1]},
        r"^solver: must be an object",
    ),
    (
        "caps of the wrong length",
        lambda o: o | {"max_freeze_ratio": [0.9, 0.9]},
        r"^max_freeze_ratio: must list 4 caps in \[0, 1\]",
    ),
    (
        "cap above 1",
        lambda o: o | {"max_freeze_ratio": [0.9, 0.9, 1.1, 0.9]},
        r"^max_freeze_ratio: must list 4 caps in \[0, 1\]",
    ),
    (
        "a cap given as a boolean",
        lambda o: o | {"max_freeze_ratio": [True, 0.9, 0.9, 0.9]},
        r"^max_freeze_ratio: must list 4 caps in \[0, 1\]",
    ),
    (
        "stage_to_rank disagrees with order",
        lambda o: _edit(o, lambda x: x["schedule"].__setitem__("stage_to_rank", [0, 0, 1, 1])),
        r"^schedule\.stage_to_rank: says \[0, 0, 1, 1\] but the order has \[0, 1, 2, 3\]",
    ),
    (
        "stages_per_rank disagrees with order",
        lambda o: _edit(o, lambda x: x["schedule"].__setitem__("stages_per_rank", 7)),
        r"^schedule\.stages_per_rank: says 7 but the order has 1",
    ),
    (
        "num_ranks disagrees with order",
        lambda o: _edit(o, lambda x: x["schedule"].__setitem__("num_ranks", 5)),
        r"^schedule\.num_ranks: says 5 but the order has 4",
    ),
    (
        "invalid order",
        lambda o: _edit(o, lambda x: x["schedule"]["order"][0].reverse()),
        r"^invalid schedule: ",
    ),
    (
        "profile stage invalid",
        lambda o: _edit(o, lambda x: x["profile"]["stages"][1].__setitem__("forward_ms", -1)),
        r"^profile\.stages\[1\]\.forward_ms: must be >= 0",  # (the field as the plan file has it)
    ),
    ("not an object", lambda o: [o], r"^plan: must be a JSON object"),
]


@pytest.mark.parametrize(("mutate", "message"), [b[1:] for b in BAD_PLANS], ids=[b[0] for b in BAD_PLANS])
def test_load_errors_name_the_field(tmp_path, plan_obj, mutate, message: str) -> None:
    bad = mutate(plan_obj)
    with pytest.raises(TfplanError) as info:
        plan_mod.from_dict(bad)
    assert re.search(message, str(info.value).split("\n")[0]), str(info.value)
    # Through a file, the message starts with the file's name.
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(TfplanError) as info:
        plan_mod.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert re.search(message.lstrip("^"), str(info.value).split("\n")[0])


def test_the_unmodified_object_loads(plan_obj, hetero_plan) -> None:
    assert plan_mod.from_dict(plan_obj).ratios == hetero_plan.ratios


def test_load_missing_file_and_invalid_json(tmp_path) -> None:
    with pytest.raises(TfplanError, match="^plan not found: "):
        plan_mod.load(tmp_path / "none.json")
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 1,\n "schedule": }')
    with pytest.raises(TfplanError, match=r"bad\.json: invalid JSON at line 2, column 14"):
        plan_mod.load(path)


def test_plan_schema_version_true_is_rejected(plan_obj) -> None:
    with pytest.raises(TfplanError, match="^schema_version: must be 1, 2 or 3"):
        plan_mod.from_dict(plan_obj | {"schema_version": True})


def test_ratios_of_fixed_actions_are_rejected_on_load(plan_obj_v2) -> None:
    plan_obj_v2["actions"][0]["freeze_ratio"] = 0.5  # 0F0 cannot be frozen
    with pytest.raises(TfplanError, match="0F0 has freeze_ratio 0.5, but freezing cannot shorten it"):
        plan_mod.from_dict(plan_obj_v2)


def test_table_ratios_of_unfreezable_actions_are_rejected_on_load() -> None:
    # Version 3 lists only B and W actions; one whose frozen time equals its unfrozen time cannot be frozen.
    stiff = profile.uniform(2, name="stiff", backward_frozen_ms=2.0)
    d = dag_mod.build(schedules.generate("1f1b", 2, 4), stiff)
    obj = json.loads(json.dumps(plan_mod.to_dict(plan_mod.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], stiff))))
    assert obj["freeze_ratio"] == [[0.0] * 4] * 2
    obj["freeze_ratio"][1][2] = 0.5
    with pytest.raises(TfplanError, match=r"^freeze_ratio\[1\]\[2\]: 1B2 has freeze_ratio 0.5, but freezing cannot"):
        plan_mod.from_dict(obj)


@pytest.mark.parametrize("target", ["fast", float("nan"), -2.0, 0.5, float("inf"), True])
def test_target_speedup_must_be_a_finite_number_from_1(plan_obj, target) -> None:
    plan_obj["target_speedup"] = target
    with pytest.raises(TfplanError, match="target_speedup: must be a finite number >= 1 or null"):
        plan_mod.from_dict(plan_obj)


@pytest.mark.parametrize(("source", "message"), [
    ([1], r"^profile\.source: must be an object"),
    ({"model": ["tiny"]}, r"^profile\.source\.model: must be a string, number, boolean or null"),
    ({"seq_len": float("inf")}, r"^profile\.source\.seq_len: must be finite"),
    ({str(i): i for i in range(plan_profile.MAX_SOURCE_FIELDS + 1)}, r"^profile\.source: at most 64 fields"),
])
def test_a_bad_profile_source_names_the_field(plan_obj, source, message) -> None:
    plan_obj["profile"]["source"] = source
    with pytest.raises(TfplanError, match=message):
        plan_mod.from_dict(plan_obj)


def test_unreadable_plan_files_are_one_line(tmp_path) -> None:
    cases = {"binary.json": (b"\xff\xfe\x00" * 10, "not a UTF-8 text file"),
             "deep.json": (b"[" * 5000 + b"]" * 5000, "JSON nested too deeply")}
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TfplanError, match=message):
            plan_mod.load(tmp_path / name)
    with pytest.raises(TfplanError, match="is a folder"):
        plan_mod.load(tmp_path)


def _small_plan_obj() -> dict:
    prof = profile.uniform(2, name="unit")
    d = dag_mod.build(schedules.generate("1f1b", 2, 4), prof)
    return json.loads(json.dumps(plan_mod.to_dict(plan_mod.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], prof))))


SMALL_PLAN = _small_plan_obj()


@settings(max_examples=300, deadline=None)
@given(mutated(SMALL_PLAN) | json_values)
def test_fuzzed_plans_raise_only_tfplan_errors(obj) -> None:
    try:
        plan_mod.from_dict(obj)
    except TfplanError as exc:
        assert str(exc).strip() and "\n" not in str(exc).split(":")[0]


def test_a_key_with_a_newline_stays_on_one_line() -> None:
    # found by the fuzzer above: an unknown key "\n" in solver.phases[2] split the error in two lines
    obj = json.loads(json.dumps(SMALL_PLAN))
    obj["solver"]["phases"][2]["\n"] = 1
    with pytest.raises(TfplanError) as info:
        plan_mod.from_dict(obj)
    assert str(info.value).startswith('solver.phases[2]."\\n": unknown field') and "\n" not in str(info.value)
    # and again (2026-12-04): a profile.source key "\n" holding a list
    obj = json.loads(json.dumps(SMALL_PLAN))
    obj["profile"]["source"]["\n"] = []
    with pytest.raises(TfplanError) as info:
        plan_mod.from_dict(obj)
    assert str(info.value).startswith('profile.source."\\n": must be a string') and "\n" not in str(info.value)

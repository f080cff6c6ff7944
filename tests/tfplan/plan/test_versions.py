"""Older plan files (versions 1 and 2, tfplan.plan.plan_ratios' per-action list) still load to the same plan, and
version 3's compact table (Note [compact plan]) is a fraction of their size."""

from __future__ import annotations

import json

import pytest

from tests.tfplan.plan.toy_plans import _as_version_2, _plan
from tfplan.errors import TfplanError
from tfplan.plan import plan as plan_mod
from tfplan.step.simulate import simulate


def test_version_2_plans_still_load(hetero_plan, plan_obj_v2) -> None:
    # A version-2 file's timeline is what re-simulating its ratios gives, and it loads to the same plan.
    dag = hetero_plan.dag
    by_name = {a["action"]: a for a in plan_obj_v2["actions"]}
    sim = simulate(dag, [by_name[str(a)]["duration_ms"] for a in dag.actions])
    assert sim.batch_time_ms == pytest.approx(plan_obj_v2["predicted"]["planned_ms"], rel=1e-9)
    for v, a in enumerate(dag.actions):
        item = by_name[str(a)]
        assert sim.start_ms[v] == pytest.approx(item["start_ms"], rel=1e-9, abs=1e-12)
    loaded = plan_mod.from_dict(plan_obj_v2)
    assert loaded.ratios == hetero_plan.ratios and loaded.predicted == hetero_plan.predicted
    assert loaded.solver == hetero_plan.solver


def test_a_plan_file_is_compact(tmp_path) -> None:
    # Note [compact plan]: a ratio per (stage, micro-batch) instead of an object per action; at 4 x 64 the file
    # is under a fifth of version 2's, and it holds each number once.
    plan = _plan("1f1b", 64)
    plan_mod.write(plan, tmp_path / "plan.json")
    v2 = tmp_path / "v2.json"
    v2.write_text(json.dumps(_as_version_2(json.loads((tmp_path / "plan.json").read_text())), indent=1))
    size, old = (tmp_path / "plan.json").stat().st_size, v2.stat().st_size
    assert size < old / 5, (size, old)
    assert plan_mod.load(v2).ratios == plan_mod.load(tmp_path / "plan.json").ratios == plan.ratios


def _as_version_1(obj: dict) -> dict:
    """A version-3 plan object as tfplan wrote it before issue 9: per-action list, no gaps, no time limit."""
    obj = _as_version_2(obj) | {"schema_version": 1}
    obj["solver"].pop("time_limit_s")
    for phase in obj["solver"]["phases"]:
        phase.pop("gap")
    return obj


def test_version_1_plans_still_load(plan_obj, hetero_plan) -> None:
    old = _as_version_1(plan_obj)
    loaded = plan_mod.from_dict(old)
    assert loaded.ratios == hetero_plan.ratios
    assert loaded.solver.time_limit_s is None and all(p.gap is None for p in loaded.solver.phases)
    assert plan_mod.from_dict(old | {"solver": {}}).solver is None  # a version-1 plan not made by the LP
    assert plan_mod.from_dict(plan_obj | {"solver": None}).solver is None
    # A version-1 solver section lacking a key is a one-line error naming it, not a KeyError in `tfplan show`.
    del old["solver"]["wall_s"]
    with pytest.raises(TfplanError, match=r"^solver\.wall_s: missing required field"):
        plan_mod.from_dict(old)


def test_plans_without_a_profile_source_still_load(plan_obj, hetero_plan) -> None:
    del plan_obj["profile"]["source"]
    assert plan_mod.from_dict(plan_obj).profile_source == {}
    assert plan_mod.from_dict(_as_version_1(plan_obj)).profile_source == {}

"""A plan's predictions (step times with no freezing, the plan, uniform freezing, all frozen): the simulator's,
reproduced from the file, and with the profile's step overhead in every one."""

from __future__ import annotations

import pytest

from tests.tfplan.plan.toy_plans import UNIFORM
from tfplan.cost import profile
from tfplan.cost.profile import Profile
from tfplan.plan import plan as plan_mod
from tfplan.schedule import schedules
from tfplan.solve import solver
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate


def test_simulator_reproduces_planned_ms_from_the_file(hetero_plan, plan_obj) -> None:
    # Version 3 keeps no timeline (Note [compact plan]): the ratio table and the stage costs give it back.
    dag = hetero_plan.dag
    table = plan_obj["freeze_ratio"]
    ratios = [table[a.stage][a.mb] if a.kind in "BW" else 0.0 for a in dag.actions]
    sim = simulate(dag, dag.durations(ratios))
    predicted = plan_obj["predicted"]
    assert sim.batch_time_ms == pytest.approx(predicted["planned_ms"], rel=1e-9)
    # The plan's makespan is the LP's (within the solver's tolerances).
    assert predicted["planned_ms"] == pytest.approx(plan_obj["solver"]["lp_makespan_ms"], rel=1e-8)


def test_predictions(hetero_plan) -> None:
    p = hetero_plan.predicted
    dag = hetero_plan.dag
    assert p.speedup == p.no_freeze_ms / p.planned_ms
    assert p.to_dict()["speedup"] == p.no_freeze_ms / p.planned_ms
    assert p.no_freeze_ms == simulate(dag).batch_time_ms
    assert p.all_frozen_ms == simulate(dag, dag.d_min).batch_time_ms
    assert p.planned_ms == simulate(dag, dag.durations(list(hetero_plan.ratios))).batch_time_ms
    assert p.all_frozen_ms <= p.planned_ms <= p.no_freeze_ms
    # Uniform baseline: every freezable action at the plan's overall mean ratio.
    groups = [v for g in dag.freeze_groups() for v in g]
    mean = sum(hetero_plan.ratios[v] for v in groups) / len(groups)
    assert p.uniform_ms == simulate(dag, dag.durations(mean)).batch_time_ms
    assert p.planned_ms <= p.uniform_ms + 1e-9  # schedule awareness never loses to uniform freezing
    assert p.no_freeze_bubble_fraction == simulate(dag).bubble_fraction


def test_step_overhead_is_in_every_prediction(tmp_path) -> None:
    base = profile.load(UNIFORM)
    prof = Profile(name="o", p2p_ms=0.0, step_overhead_ms=5.0, stages=base.stages)
    dag = dag_mod.build(schedules.generate("gpipe", 4, 8), prof)
    plan = plan_mod.make_plan(dag, solver.solve(dag, 0.9), [0.9] * 4, prof)
    p = plan.predicted
    assert (p.no_freeze_ms, p.all_frozen_ms) == (38.0, 27.0)
    assert p.planned_ms == pytest.approx(27.8, rel=1e-8)
    assert p.speedup == pytest.approx(38.0 / 27.8, rel=1e-8)
    plan_mod.write(plan, tmp_path / "p.json")
    assert plan_mod.load(tmp_path / "p.json").predicted == p

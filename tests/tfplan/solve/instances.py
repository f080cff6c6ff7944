"""The LP instances the solver tests share: METHOD.md's toy DAG, a heterogeneous profile, and each stage's mean
ratio recomputed from a plan without the solver."""

from __future__ import annotations

from tests.conftest import PROFILES
from tfplan.cost import profile
from tfplan.cost.profile import Profile, StageCost
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.step import dag as dag_mod

CAP_TOL = lp.CAP_TOL  # on a stage's mean ratio


def _toy_dag(name: str, m: int = 8) -> dag_mod.Dag:
    return dag_mod.build(schedules.generate(name, 4, m), profile.load(PROFILES / "toy-uniform-4.json"))


def _stage_means(dag: dag_mod.Dag, ratios) -> list[float]:
    """Mean ratio over each stage's B/W actions that freezing shortens (recomputed here, not via the solver)."""
    sums, counts = [0.0] * dag.schedule.num_stages, [0] * dag.schedule.num_stages
    for v, a in enumerate(dag.actions):
        if a.kind in "BW" and dag.d_max[v] > dag.d_min[v]:
            sums[a.stage] += ratios[v]
            counts[a.stage] += 1
    return [s / c if c else 0.0 for s, c in zip(sums, counts)]


def _hetero(num_stages: int, p2p: float = 0.1) -> Profile:
    return Profile(
        name="h",
        p2p_ms=p2p,
        stages=tuple(
            StageCost(
                forward_ms=1.0 + 0.1 * s,
                backward_ms=2.0 + 0.3 * s,
                backward_frozen_ms=0.8 + 0.1 * s,
                backward_input_ms=1.1,
                backward_weight_ms=1.0 + 0.2 * s,
                backward_weight_frozen_ms=0.1,
            )
            for s in range(num_stages)
        ),
    )

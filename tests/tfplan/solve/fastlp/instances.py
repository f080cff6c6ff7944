"""The fastlp tests' instances and checks: random profiles (_random_profile), schedules whose micro-batches
repeat (COMPRESSED), random DAGs for hypothesis, each phase's LP at a margin, and _assert_agrees (fastlp
against solver.solve, GLOP on the full LP, with the tolerances of each phase)."""

from __future__ import annotations

import os
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import strategies as st

from tfplan.cost.profile import Profile, StageCost
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.solve import fastlp, lp, solver
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.tied import Compressed, Phase
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

PHASE1_REL = 1e-9  # makespan: as exact as GLOP's own
PHASE2_REL = 1e-7  # total freeze
# Even spread (issue 9: the two backends agree to 1e-6): phase 3 keeps the total within R2 (1 + 1e-9) + 1e-9
# and T within T1 (1 + 1e-9), and its optimum moves by a multiple of any violation of those rows. GLOP's own
# plans violate them by up to ~1e-10 relative; ours is certified by a safe dual bound to 1e-9.
PHASE3_REL = 1e-6
CAP_TOL = lp.CAP_TOL  # on a stage's mean ratio, as tests/tfplan/solve/instances.py


def _random_profile(num_stages: int, seed: int, p2p_ms: float = 0.0) -> Profile:
    """Per-stage random costs; some stages cannot be frozen at all (empty freeze group)."""
    rng = random.Random(seed)
    stages = []
    for _ in range(num_stages):
        b = rng.uniform(1.0, 4.0)
        i = rng.uniform(0.3, 0.7) * b
        w = b - i
        stiff = rng.random() < 0.15  # freezing buys nothing on this stage
        b_frozen = b if stiff else rng.uniform(0.3, 0.9) * b
        w_frozen = w if stiff else rng.uniform(0.0, 0.3) * w
        stages.append(StageCost(
            forward_ms=rng.uniform(0.5, 2.0), backward_ms=b, backward_frozen_ms=b_frozen,
            backward_input_ms=i, backward_weight_ms=w, backward_weight_frozen_ms=w_frozen,
        ))
    # Rank tails and a dispatch cost (tfplan.step.dag Note [rank tails]) from their own generator, so that the
    # stage costs of each seed stay what they were.
    extra = random.Random(seed + 1_000_003)
    stages = [replace(c, tail_ms=extra.choice([0.0, extra.uniform(0.0, 8.0)])) for c in stages]
    return Profile(name=f"random-{seed}", p2p_ms=p2p_ms, dispatch_ms=extra.choice([0.0, 0.05]), stages=tuple(stages))


def _stage_means(dag: dag_mod.Dag, ratios) -> list[float]:
    groups = dag.freeze_groups()
    return [sum(ratios[v] for v in g) / len(g) if g else 0.0 for g in groups]


def _assert_agrees(dag: dag_mod.Dag, caps, target: float | None = None, **margins) -> lp.Solution:
    ref = solver.solve(dag, caps, target)
    got = fastlp.solve(dag, caps, target, **margins)
    assert got.backend == "fastlp"
    assert [p.name for p in got.phases] == ["makespan", "total_freeze", "even_spread"]
    assert got.status == "OPTIMAL" and all(p.status == "OPTIMAL" for p in got.phases)
    for number, p in enumerate(got.phases, 1):  # certified: U - L within the phase's tolerance (Note [LP certificate])
        assert p.gap is not None and 0.0 <= p.gap <= lp.gap_tol(number) * max(1.0, abs(p.objective))
    assert got.makespan_ms == pytest.approx(ref.makespan_ms, rel=PHASE1_REL, abs=1e-12)
    assert got.phases[1].objective == pytest.approx(ref.phases[1].objective, rel=PHASE2_REL, abs=1e-8)
    assert got.phases[2].objective == pytest.approx(ref.phases[2].objective, rel=PHASE3_REL, abs=1e-7)
    # The plan itself: ratios in [0, 1], only on freeze-group actions, caps kept, makespan reproduced.
    members = {v for g in dag.freeze_groups() for v in g}
    assert all(0.0 <= r <= 1.0 for r in got.ratios)
    assert all(r == 0.0 for v, r in enumerate(got.ratios) if v not in members)
    assert got.durations == pytest.approx(dag.durations(got.ratios), abs=1e-12)
    cap_list = lp.check_caps(caps, dag.schedule.num_stages)
    for mean, cap in zip(_stage_means(dag, got.ratios), cap_list):
        assert mean <= cap + CAP_TOL
    assert sum(got.ratios) == pytest.approx(got.phases[1].objective, rel=2e-9, abs=1e-8)
    bound = got.makespan_ms if target is None else max(target, got.makespan_ms)
    makespan = simulate(dag, got.durations).makespan_ms
    assert makespan <= bound * (1 + 1.1e-9) + 1e-12
    if target is None:
        assert makespan >= got.makespan_ms * (1 - 1e-9)
    return got


# (schedule, ranks, micro-batches, stages per rank): long enough that runs outlive the phase-2 margin.
COMPRESSED = [
    ("1f1b", 2, 27, None), ("1f1b", 3, 40, None), ("gpipe", 3, 31, None), ("interleaved-1f1b", 2, 36, 2),
    ("interleaved-zb", 2, 36, 2), ("looped-bfs", 2, 29, 2), ("zbv", 2, 33, 2), ("dualpipev", 2, 30, 2),
]


EXAMPLES = int(os.environ.get("FASTLP_EXAMPLES", "40"))


@st.composite
def random_dags(draw, max_ranks: int, max_mbs: int) -> dag_mod.Dag:
    """Any of the seven schedules (where its arguments fit) on a _random_profile with a point-to-point lag."""
    name, ranks, mbs = (draw(st.sampled_from(list(schedules.SCHEDULES))), draw(st.integers(1, max_ranks)),
                        draw(st.integers(1, max_mbs)))
    try:
        sched = schedules.generate(name, ranks, mbs)
    except TfplanError:
        assume(False)
    seed, p2p = draw(st.integers(0, 10_000)), draw(st.sampled_from([0.0, 0.05, 0.3]))
    return dag_mod.build(sched, _random_profile(sched.num_stages, seed, p2p))


def _phase_lps(dag: dag_mod.Dag, caps: float, margin: int):
    """Per phase: (Phase, compression at `margin`, the true optimum from GLOP on the full LP)."""
    ref = solver.solve(dag, caps)
    g = GraphArrays.from_dag(dag)
    c = Compressed(g, Runs.detect(g).ties(g.n, (margin, margin)))
    cap_arr = np.full(dag.schedule.num_stages, caps)
    t_ub = lp.makespan_bound(ref.makespan_ms, None)
    phases = [
        Phase(number=1, caps=cap_arr, t_max=simulate(dag).makespan_ms),
        Phase(number=2, caps=cap_arr, t_ub=t_ub, t_max=t_ub),
        Phase(number=3, caps=cap_arr, t_ub=t_ub, r_ub=lp.total_bound(ref.phases[1].objective), t_max=t_ub),
    ]
    return [(phase, c, p.objective) for phase, p in zip(phases, ref.phases)]

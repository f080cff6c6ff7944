"""The goodput model and its LP (tfplan.goodput, tfplan.goodput_lp): closed forms, the reduction to the makespan
objective without noise, and the optimum against an independent search over the stage means."""

from __future__ import annotations

import random

import pytest

from tfplan import dag as dag_mod
from tfplan import profile, schedules, solver
from tfplan.goodput import NoiseModel, efficiency, evaluate, progress
from tfplan.goodput_lp import solve_goodput
from tfplan.simulate import simulate


def _noise(scales, shares, tokens: int = 512) -> NoiseModel:
    return NoiseModel(noise_scale_tokens=tuple(scales), grad_sq_share=tuple(shares), microbatch_tokens=tokens,
                      source="given")


def test_efficiency_and_progress_closed_forms():
    assert efficiency(4096.0, 4096.0) == 0.5 and efficiency(4096.0, 0.0) == 1.0
    noise = _noise([1000.0, 3000.0], [0.25, 0.75])
    # stage 0 keeps half of 4000 tokens (2000 / 3000), stage 1 all of them (4000 / 7000)
    assert progress([0.5, 0.0], 4000.0, noise) == pytest.approx(0.25 * 2 / 3 + 0.75 * 4 / 7)
    g = evaluate([0.5, 0.0], 400.0, 500.0, 4000.0, noise)
    unfrozen = 0.25 * 0.8 + 0.75 * 4 / 7
    assert g.efficiency == pytest.approx((0.25 * 2 / 3 + 0.75 * 4 / 7) / unfrozen) and g.speedup == 1.25
    assert g.goodput == pytest.approx(g.efficiency * 1.25)


def _dag(name: str, ranks: int, m: int, seed: int):
    rng = random.Random(seed)
    sched = schedules.generate(name, ranks, m)
    stages = []
    for _ in range(sched.num_stages):
        f, b = rng.uniform(5, 15), rng.uniform(10, 30)
        frozen = b * rng.uniform(0.3, 0.7)
        stages.append(profile.StageCost(forward_ms=f, backward_ms=b, backward_frozen_ms=frozen,
                                        backward_input_ms=frozen, backward_weight_ms=b - frozen,
                                        backward_weight_frozen_ms=0.0, tail_ms=rng.uniform(0, 3)))
    prof = profile.Profile(name="random", p2p_ms=rng.uniform(0, 1), step_overhead_ms=rng.uniform(0, 5),
                           stages=tuple(stages))
    return dag_mod.build(sched, prof)


def test_without_noise_the_optimum_is_the_makespan_plans_speedup():
    d = _dag("1f1b", 2, 4, 0)
    g = solve_goodput(d, [0.8, 0.8], _noise([0.0, 0.0], [0.5, 0.5]), 2048.0)
    makespan = solver.solve(d, [0.8, 0.8])
    fastest = makespan.makespan_ms + d.step_overhead_ms
    assert g.goodput / g.unfrozen_goodput == pytest.approx(simulate(d).batch_time_ms / fastest, rel=1e-9)


def _independent_optimum(d, caps, noise, batch) -> float:
    """max over stage means m <= caps of P(m) / (T*(m) + o), T*(m) the makespan LP's optimum at caps m (the
    reference backend's phase 1): a grid, then Nelder-Mead from its best point. Shares nothing with the
    goodput LP but the model."""
    from scipy.optimize import minimize

    def goodput(m) -> float:
        m = [min(c, max(0.0, x)) for x, c in zip(m, caps)]
        return progress(m, batch, noise) / (solver.solve(d, m).makespan_ms + d.step_overhead_ms)

    grid = [(a * caps[0] / 10, b * caps[1] / 10) for a in range(11) for b in range(11)]
    best = max(grid, key=goodput)
    res = minimize(lambda m: -goodput(m), best, method="Nelder-Mead", bounds=list(zip([0.0, 0.0], caps)),
                   options={"xatol": 1e-9, "fatol": 1e-13, "maxiter": 2000})
    return max(goodput(best), -res.fun)


@pytest.mark.parametrize(("name", "m", "seed", "scales"), [
    ("1f1b", 4, 1, (300.0, 300.0)),
    ("1f1b", 6, 2, (1500.0, 4000.0)),
    ("gpipe", 4, 3, (800.0, 200.0)),
    ("1f1b", 5, 4, (20000.0, 100.0)),
])
def test_the_optimum_equals_an_independent_search_within_1e_6(name, m, seed, scales):
    pytest.importorskip("scipy")
    d = _dag(name, 2, m, seed)
    caps, noise, batch = [0.9, 0.7], _noise(scales, (0.4, 0.6)), 2048.0
    g = solve_goodput(d, caps, noise, batch)
    reference = _independent_optimum(d, caps, noise, batch)
    assert g.goodput == pytest.approx(reference, rel=1e-6)
    assert g.goodput <= g.bound * (1 + 1e-12) and g.bound <= g.goodput * (1 + 1e-7)  # certified
    assert all(0.0 <= x <= c + 1e-12 for x, c in zip(g.means, caps))


def test_a_huge_noise_scale_makes_freezing_not_pay():
    d = _dag("1f1b", 2, 4, 5)
    g = solve_goodput(d, [0.9, 0.9], _noise([1e7, 1e7], [0.5, 0.5]), 2048.0)
    assert not g.pays and g.means == [0.0, 0.0]

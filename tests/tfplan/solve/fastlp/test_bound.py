"""tfplan.solve.fastlp.bound: the safe lower bound from a tied dual (below the optimum, tight where certified,
safe for any dual vector) or from the untied primal's duals, and the start-time windows that tighten it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tests.tfplan.solve.fastlp.instances import (
    COMPRESSED,
    EXAMPLES,
    _phase_lps,
    _random_profile,
    random_dags,
)
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.solve.fastlp.dual import tied_dual
from tfplan.solve.fastlp.glop import solve_glop
from tfplan.solve.fastlp.graph import GraphArrays
from tfplan.solve.fastlp.tied import Compressed, tied_primal
from tfplan.step import dag as dag_mod


@pytest.mark.parametrize(("name", "p", "m", "v"), COMPRESSED, ids=[c[0] for c in COMPRESSED])
def test_safe_bound_is_below_the_optimum_and_tight(name: str, p: int, m: int, v: int | None) -> None:
    # tfplan.solve.fastlp.bound: L from the tied dual's solution is a lower bound on the true optimum; where U meets it
    # within GAP_TOL (certified), it is the optimum to that tolerance. Windows only tighten it.
    from tfplan.solve.fastlp.bound import Windows, from_tied_dual, safe_lower_bound

    sched = schedules.generate(name, p, m, v)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=17, p2p_ms=0.05))
    windows = Windows.build(GraphArrays.from_dag(dag), dag)
    for phase, c, opt in _phase_lps(dag, 0.8, sched.num_stages):
        upper, lower = solve_glop(tied_primal(c, phase)), solve_glop(tied_dual(c, phase))
        dual = from_tied_dual(c, phase, lower.x)
        plain, tight = safe_lower_bound(c.g, phase, dual), safe_lower_bound(c.g, phase, dual, windows)
        scale = max(1.0, abs(opt))  # GLOP's optimum is exact to its tolerances: 1e-10 of slack
        assert plain <= tight + 1e-12 * scale and tight <= opt + 1e-10 * scale  # (and rounding)
        if upper.objective - tight <= lp.GAP_TOL * max(1.0, abs(upper.objective)):
            assert tight == pytest.approx(opt, rel=2e-9, abs=2e-9)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag=random_dags(max_ranks=4, max_mbs=20))
def test_chain_windows_lie_within_the_longest_path_windows(dag) -> None:
    # bound.Windows.chains bounds each action's earliest start and tail by its rank's chain alone: paths of the
    # DAG, so never above the longest paths of Windows.build (and any window inside build's keeps L safe).
    from tfplan.solve.fastlp.bound import Windows

    g = GraphArrays.from_dag(dag)
    paths, chains = Windows.build(g, dag), Windows.chains(g, dag)
    value = lambda pair: pair[0] + pair[1]  # noqa: E731 (the windows are double-double pairs)
    slack = 1e-9 * max(1.0, value(paths.t_min))  # two summation orders
    assert np.all(value(chains.head) >= 0.0) and np.all(value(chains.head) <= value(paths.head) + slack)
    assert np.all(value(chains.tail) <= value(paths.tail) + slack) and value(chains.t_min) <= value(paths.t_min) + slack
    # Each rank's chain is a path from the step's start to its end: the busiest rank gives t_min.
    d_min = g.d_max - g.delta
    busy = np.bincount(g.rank, weights=d_min) + np.bincount(g.rank, weights=g.lags[0])
    tails = np.zeros(dag.schedule.num_ranks)
    tails[g.rank[g.sinks]] = g.sink_tail
    assert value(chains.t_min) == pytest.approx(float((busy + tails).max()), rel=1e-12)


def test_a_perturbed_dual_still_gives_a_lower_bound() -> None:
    # Weak duality holds for any dual vector: noise (even negative values, clipped) only loosens the bound.
    from tfplan.solve.fastlp.bound import from_tied_dual, safe_lower_bound

    dag = dag_mod.build(schedules.generate("interleaved-1f1b", 2, 24, 2), _random_profile(4, seed=5, p2p_ms=0.1))
    rng = np.random.default_rng(0)
    for phase, c, opt in _phase_lps(dag, 0.7, 2):
        x = solve_glop(tied_dual(c, phase)).x
        exact = safe_lower_bound(c.g, phase, from_tied_dual(c, phase, x))
        assert exact == pytest.approx(opt, rel=1e-8, abs=1e-8)
        for scale in (1e-9, 1e-6, 1e-3, 1.0):
            noisy = x * (1 + scale * rng.standard_normal(len(x))) + scale * rng.standard_normal(len(x))
            bound = safe_lower_bound(c.g, phase, from_tied_dual(c, phase, noisy))
            assert bound <= opt + 1e-9 * max(1.0, abs(opt))
        assert safe_lower_bound(c.g, phase, from_tied_dual(c, phase, 0.0 * x)) <= opt


def test_untied_primal_duals_certify_the_full_lp() -> None:
    # Without ties the tied primal is the full LP and its own row duals give the safe bound.
    from tfplan.solve.fastlp.bound import from_primal_duals, safe_lower_bound
    from tfplan.solve.fastlp.graph import Ties

    dag = dag_mod.build(schedules.generate("zbv", 2, 6, 2), _random_profile(4, seed=9, p2p_ms=0.1))
    for phase, c, opt in _phase_lps(dag, 0.6, 0):
        c = Compressed(c.g, Ties.none(c.g.n))
        primal = tied_primal(c, phase)
        result = solve_glop(primal, lp.GLOP_PARAMS, duals=True)
        bound = safe_lower_bound(c.g, phase, from_primal_duals(c, phase, primal, result.duals))
        assert bound <= opt + 1e-10 * max(1.0, abs(opt))
        assert bound == pytest.approx(opt, rel=1e-9, abs=1e-9)


def test_a_phase_3_point_past_its_bounds_by_rounding_is_judged_on_the_relaxed_lp() -> None:
    # lower.relaxed_bound (Note [explained negative gaps]): the exact value of phase 3's tied primal point and the
    # dual's safe bound on the LP relaxed to what the point's plan reaches: never above the bound on the LP itself,
    # lower where the plan is past T by rounding (1e-13 of T here, by lowering t_ub under it), and no answer at all
    # past POINT_TOL.
    from dataclasses import replace

    from tfplan.solve.fastlp.graph import Runs
    from tfplan.solve.fastlp.lower import POINT_TOL, lower_bound, relaxed_bound
    from tfplan.solve.fastlp.margins import Margins
    from tfplan.step.simulate import simulate

    dag = dag_mod.build(schedules.generate("1f1b", 4, 32), _random_profile(4, seed=4, p2p_ms=1.0))
    phase, c, opt = _phase_lps(dag, 0.9, 4)[2]
    margins = Margins(dag, c.g, Runs.detect(c.g), 2, None, simulate(dag).start_ms)
    upper, lower = solve_glop(tied_primal(c, phase), lp.GLOP_PARAMS), solve_glop(tied_dual(c, phase))
    own = lower_bound(c, phase, None, None, lower, margins.chain_windows())
    value, bound = relaxed_bound(margins, c, c, phase, upper.x, lower)
    assert value == pytest.approx(upper.objective, rel=1e-9, abs=1e-9) and value >= opt - 1e-7
    assert bound <= own  # (GLOP's point may already be past a bound by its tolerance)
    makespan = simulate(margins.dag, (c.g.d_max - c.g.delta * _ratios(c, upper.x)).tolist()).makespan_ms
    tight = replace(phase, t_ub=makespan * (1 - 1e-13), t_max=makespan * (1 - 1e-13))
    _, relaxed = relaxed_bound(margins, c, c, tight, upper.x, lower)
    assert relaxed <= lower_bound(c, tight, None, None, lower, margins.chain_windows())
    past = replace(phase, t_ub=makespan * (1 - 10 * POINT_TOL), t_max=makespan * (1 - 10 * POINT_TOL))
    assert relaxed_bound(margins, c, c, past, upper.x, lower) is None


def _ratios(c, x):
    from tfplan.solve.fastlp.tied import expand_ratios

    return expand_ratios(c, x)

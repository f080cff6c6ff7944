"""tfplan.solve.fastlp.refine: a GLOP point recomputed from its basis (Note [refined duals])."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest

from tests.tfplan.solve.fastlp.instances import _random_profile
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.solve.fastlp.bound import Windows, from_tied_dual, safe_lower_bound
from tfplan.solve.fastlp.dual import tied_dual
from tfplan.solve.fastlp.glop import solve_glop
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.refine import refined
from tfplan.solve.fastlp.tied import AT_LOWER, BASIC, FREE, Compressed, Phase, tied_primal
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

pytest.importorskip("scipy")


def _phase3_dual(name: str = "1f1b", p: int = 6, m: int = 240, seed: int = 21):
    """Phase 3's tied dual of a random instance at margin p, with GLOP's optimal point and basis."""
    sched = schedules.generate(name, p, m, 2 if name == "interleaved-1f1b" else None)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=seed, p2p_ms=0.05))
    g = GraphArrays.from_dag(dag)
    c = Compressed(g, Runs.detect(g).ties(g.n, (p, p)))
    caps = np.full(sched.num_stages, 0.8)
    tight = "primal_feasibility_tolerance: 1e-10"
    t1 = lp.makespan_bound(solve_glop(tied_primal(c, Phase(number=1, caps=caps, t_max=simulate(dag).makespan_ms)),
                                      tight).objective, None)
    r2 = solve_glop(tied_primal(c, Phase(number=2, caps=caps, t_ub=t1, t_max=t1)), tight).objective
    phase = Phase(number=3, caps=caps, t_ub=t1, t_max=t1, r_ub=lp.total_bound(r2))
    dual = tied_dual(c, phase)
    return g, dag, c, phase, dual, solve_glop(dual, basis=True)


def _residual(dual, x: np.ndarray) -> float:
    """The largest violation of a row of `dual` (row_lo = -inf there) or of a column bound by x."""
    act = np.zeros(len(dual.row_hi))
    np.add.at(act, dual.ri, dual.val * x[dual.ci])
    return max(float(np.max(act - dual.row_hi)), float(np.max(dual.lb - x)), 0.0)


@pytest.mark.parametrize(("name", "p", "m", "seed"), [("1f1b", 6, 240, 21), ("interleaved-1f1b", 4, 200, 5)])
def test_a_point_off_its_basis_comes_back_to_the_basic_solution(name: str, p: int, m: int, seed: int) -> None:
    # GLOP's point with noise of 1e-6 on its basic columns: the tied rows it breaks are charged in the safe
    # bound once per action they stand for. Refined, the point is the basic solution again (to rounding), its
    # rows hold, and the safe bound is GLOP's own again.
    g, dag, c, phase, dual, result = _phase3_dual(name, p, m, seed)
    basic = result.basis[0] == BASIC
    noisy = result.x.copy()
    noisy[basic] += np.random.default_rng(0).uniform(0.0, 1e-6, int(basic.sum()))
    again = refined(dual, replace(result, x=noisy))
    assert again.objective == result.objective and again.basis is result.basis  # only the point changes
    scale = max(1.0, float(np.abs(result.x).max()))
    assert np.abs(again.x - result.x).max() <= 1e-10 * scale
    assert _residual(dual, noisy) > 1e-7 and _residual(dual, again.x) <= 1e-11 * scale
    windows = Windows.chains(g, dag)
    bound = {k: safe_lower_bound(g, phase, from_tied_dual(c, phase, x), windows)
             for k, x in (("glop", result.x), ("noisy", noisy), ("refined", again.x))}
    tol = lp.gap_tol(3) * max(1.0, abs(result.objective))
    assert bound["noisy"] < result.objective - 10 * tol  # the noise costs the bound far more than the tolerance
    assert bound["refined"] == pytest.approx(bound["glop"], abs=1e-3 * tol)
    assert bound["refined"] <= result.objective + 1e-3 * tol  # (a lower bound on the tied dual's own optimum too)


def test_the_basic_solution_solves_the_basis_system() -> None:
    # The refined point against numpy's dense solve of the same square system: active rows at their bound,
    # nonbasic columns at theirs (here all at 0 or free at 0), basic columns the unknowns.
    _, _, _, _, dual, result = _phase3_dual("1f1b", 4, 48, 3)
    cols, rows = result.basis
    basic, active = np.flatnonzero(cols == BASIC), np.flatnonzero(rows != BASIC)
    dense = np.zeros((len(dual.row_hi), len(dual.lb)))
    np.add.at(dense, (dual.ri, dual.ci), dual.val)
    x_b = np.linalg.solve(dense[np.ix_(active, basic)], dual.row_hi[active])  # nonbasic columns all at 0 here
    assert np.all(np.isin(cols[cols != BASIC], (FREE, AT_LOWER)))
    again = refined(dual, result)
    assert np.allclose(again.x[basic], np.clip(x_b, dual.lb[basic], dual.ub[basic]), rtol=1e-12, atol=1e-12)


def test_without_scipy_or_a_usable_basis_the_result_comes_back_unchanged(monkeypatch) -> None:
    _, _, _, _, dual, result = _phase3_dual("1f1b", 4, 48, 3)
    assert refined(dual, None) is None
    assert refined(dual, replace(result, basis=None)).x is result.x
    cols, rows = result.basis
    not_square = (np.where(cols == BASIC, AT_LOWER, cols), rows)  # every column nonbasic: too few unknowns
    assert refined(dual, replace(result, basis=not_square)).x is result.x
    monkeypatch.setitem(sys.modules, "scipy.sparse.linalg", None)  # as if scipy were not installed
    assert refined(dual, result).x is result.x


def test_a_solve_whose_duals_are_off_their_bases_is_certified_by_refining_them(monkeypatch) -> None:
    # lower.dual_bound: a tied dual whose safe bound falls short of GLOP's own value is refined (here every
    # tied dual comes back with noise of 1e-7 on its basic columns, as if GLOP's tolerances had left it
    # there); the refined bound certifies each phase at the margins of a clean solve, without the path windows
    # or a second dual solve, and with the same optima.
    from tfplan.solve import fastlp
    from tfplan.solve.fastlp import lower, rounds

    dag = dag_mod.build(schedules.generate("1f1b", 6, 240), _random_profile(6, seed=21, p2p_ms=0.05))
    clean = fastlp.solve(dag, 0.9)
    rng = np.random.default_rng(1)
    real_lp, real_race, real_refined = rounds.solve_lp, rounds.race, lower.refined
    calls = {"noisy": 0, "refined": 0, "tighter": 0}

    def noisy(result):
        if result is None or result.basis is None:
            return result
        calls["noisy"] += 1
        basic = result.basis[0] == BASIC
        x = result.x.copy()
        x[basic] += rng.uniform(0.0, 1e-7, int(basic.sum()))
        return replace(result, x=x)

    def solve_lp(lp_, *args, **kwargs):
        result = real_lp(lp_, *args, **kwargs)
        return noisy(result) if lp_.maximize else result

    def race(lp_, *args, **kwargs):
        result = real_race(lp_, *args, **kwargs)
        return noisy(result) if lp_.maximize else result

    def counted(lp_, result):
        calls["refined"] += 1
        return real_refined(lp_, result)

    def tighter(*args, **kwargs):
        calls["tighter"] += 1
        raise AssertionError("the refined dual should certify without tighter_bound")

    monkeypatch.setattr(rounds, "solve_lp", solve_lp)
    monkeypatch.setattr(rounds, "race", race)
    monkeypatch.setattr(lower, "refined", counted)
    monkeypatch.setattr(rounds, "tighter_bound", tighter)
    sol = fastlp.solve(dag, 0.9)
    assert sol.status == "OPTIMAL" and calls["noisy"] >= 3 and calls["refined"] == calls["noisy"]
    for got, want in zip(sol.phases, clean.phases):
        assert got.objective == pytest.approx(want.objective, rel=lp.gap_tol(3))
    assert [p.objective for p in sol.phases[:2]] == pytest.approx([p.objective for p in clean.phases[:2]],
                                                                   rel=1e-9)

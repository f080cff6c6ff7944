"""tfplan.solve.fastlp.glop: warm starts GLOP rejects or a finished race stops, races within races, and the race
of the two simplex methods keeping the better optimum."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.tfplan.solve.fastlp.instances import (
    _random_profile,
)
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.solve.fastlp import glop, rounds
from tfplan.solve.fastlp.dual import tied_dual
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.tied import Compressed, Phase, tied_primal
from tfplan.step import dag as dag_mod


def test_a_basis_math_opt_rejects_gives_no_result_not_an_error() -> None:
    # glop.solve_warm: math_opt raises on a starting basis that is not square; the caller then solves cold.
    from tfplan.solve.fastlp.glop import solve_warm

    dag = dag_mod.build(schedules.generate("1f1b", 4, 24), _random_profile(4, seed=1))
    g = GraphArrays.from_dag(dag)
    c = Compressed(g, Runs.detect(g).ties(g.n, (2, 2)))
    primal = tied_primal(c, Phase(number=1, caps=np.full(4, 0.8), t_max=1e4))
    all_basic = (np.full(len(primal.lb), 5), np.full(len(primal.row_lo), 5))
    assert solve_warm(primal, all_basic, rounds.CARRIED_PARAMS) is None


def test_a_warm_solve_in_a_race_that_is_over_does_not_run() -> None:
    # glop.Race interrupts math_opt's solves too (phase 3's tied dual races a warm solve against two cold ones).
    from tfplan.solve.fastlp.glop import Race, solve_glop, solve_warm

    dag = dag_mod.build(schedules.generate("1f1b", 4, 24), _random_profile(4, seed=1))
    g = GraphArrays.from_dag(dag)
    c = Compressed(g, Runs.detect(g).ties(g.n, (2, 2)))
    primal = tied_primal(c, Phase(number=1, caps=np.full(4, 0.8), t_max=1e4))
    basis = solve_glop(primal, basis=True).basis
    assert solve_warm(primal, basis, rounds.CARRIED_PARAMS, race=Race()) is not None  # a race still on
    race = Race()
    race.finish()
    assert solve_warm(primal, basis, rounds.CARRIED_PARAMS, race=race) is None


def test_a_race_within_another_ends_with_it() -> None:
    # Note [unneeded duals]: a tied dual that phases no longer needs is stopped through the Race it was given,
    # whatever race glop.race runs inside it; once that Race is over, glop.race solves nothing.
    Race = glop.Race
    outer, inner = Race(), Race()
    assert outer.enter(inner)
    outer.finish()
    assert inner.over and not inner.enter(Race())
    assert not outer.enter(Race())
    dag = dag_mod.build(schedules.generate("1f1b", 4, 24), _random_profile(4, seed=1))
    g = GraphArrays.from_dag(dag)
    lp_ = tied_dual(Compressed(g, Runs.detect(g).ties(g.n, (2, 2))), Phase(number=1, caps=np.full(4, 0.8), t_max=1e4))
    assert glop.race(lp_, False, lp.Deadline(limit_s=None), within=outer) is None
    assert glop.race(lp_, False, lp.Deadline(limit_s=None), within=Race()) is not None


@pytest.mark.parametrize("maximize", [False, True])
def test_a_race_keeps_the_better_optimum_and_says_which_simplex_gave_it(monkeypatch, maximize: bool) -> None:
    # glop.race runs the primal and the dual simplex; when both finish it keeps the smaller value of a tied
    # primal and the larger value of a tied dual (a better bound either way), and records the winner's method.
    from tfplan.solve.fastlp.glop import LPResult

    def fake_solve_lp(lp, tied, deadline, dual_simplex=False, **kwargs):
        return LPResult(objective=2.0 if dual_simplex else 1.0, x=np.zeros(1), iterations=1, wall_s=0.0)

    monkeypatch.setattr(glop, "solve_lp", fake_solve_lp)
    lp_ = SimpleNamespace(maximize=maximize)
    got = glop.race(lp_, False, lp.Deadline(limit_s=None))
    assert (got.objective, got.dual_simplex) == ((2.0, True) if maximize else (1.0, False))

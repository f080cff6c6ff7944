"""tfplan.solve.fastlp.rounds: a phase's rounds started warm (Notes [warm phase 3], [warm margins]) and a tied
dual no longer needed stopped (Note [unneeded duals]), with the full LP's optima either way."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tfplan.solve.fastlp.instances import (
    PHASE1_REL,
    PHASE2_REL,
    PHASE3_REL,
    _assert_agrees,
    _phase_lps,
    _random_profile,
)
from tfplan.schedule import schedules
from tfplan.solve import fastlp, solver
from tfplan.solve.fastlp import glop, rounds
from tfplan.solve.fastlp.tied import BASIC
from tfplan.step import dag as dag_mod


def test_phase_3_from_phase_2s_basis_finds_the_same_optimum(monkeypatch) -> None:
    # Note [warm phase 3]: phase 3's tied primal starts from phase 2's basis (one new basic variable per new
    # row), its tied dual from phase 2's tied dual's; where GLOP fails from them, the races of both simplexes
    # run as before. Same certified optimum.
    dag = dag_mod.build(schedules.generate("1f1b", 6, 240), _random_profile(6, seed=21, p2p_ms=0.05))
    used = []
    real = rounds.solve_warm

    def spy(where: str):
        def solve_warm(primal, basis, params, limit=None, **kwargs):
            cols, rows = basis
            assert np.count_nonzero(cols == BASIC) + np.count_nonzero(rows == BASIC) == len(primal.row_lo)  # square
            used.append((where, params, primal.maximize))
            return real(primal, basis, params, limit, **kwargs)

        return solve_warm

    monkeypatch.setattr(rounds, "solve_warm", spy("rounds"))  # the tied primals'
    monkeypatch.setattr(glop, "solve_warm", spy("race"))  # glop.race's warm tied dual
    warm = _assert_agrees(dag, 0.9)
    # Phase 3's tied primal from phase 2's basis, once (phase 2's later margins would start from a point, with
    # CARRIED_PARAMS: this instance needs none), and phase 3's tied dual from phase 2's tied dual's, once.
    assert sorted(used) == [("race", glop.DUAL_WARM_PARAMS, True), ("rounds", rounds.WARM_PARAMS, False)]
    for module in (rounds, glop):  # as if GLOP could not start from either
        monkeypatch.setattr(module, "solve_warm", lambda *args, **kwargs: None)
    cold = fastlp.solve(dag, 0.9)
    assert cold.status == "OPTIMAL"
    assert warm.phases[2].objective == pytest.approx(cold.phases[2].objective, rel=PHASE3_REL, abs=1e-7)


def test_an_unneeded_dual_is_stopped_and_the_earlier_bound_certifies(monkeypatch) -> None:
    # Note [unneeded duals]: on this instance (Note [two margins]'s test, in test_margins.py) phase 2's first
    # tied dual meets the optimum and only the primal needs the second margin. The second round's dual is made
    # to run until it is stopped: the primal's U meets the first round's L, the dual is stopped, and the optima
    # are the full LP's, with the first round's dual margin handed on.
    import time as time_mod

    dag = dag_mod.build(schedules.generate("1f1b", 4, 32), _random_profile(4, 6))
    real, calls, stopped, duals, certified = rounds._lower_side, [], [], {}, rounds.certified

    def record(phase, margins, *args):
        out = certified(phase, margins, *args)
        duals.setdefault(f"handed by {phase.number}", int(sum(m.sum() for m in margins.dual)))
        return out

    def slow(c, phase, margins, deadline, warm, jobs, stop, before=None):
        calls.append(phase.number)
        periods = int(sum(m.sum() for m in margins.dual))  # the round's dual margin
        duals.setdefault(f"round {calls.count(phase.number)} of {phase.number}", periods)
        if phase.number == 2 and calls.count(2) == 2:
            for _ in range(3000):  # at most 30 s
                if stop.over:
                    break
                time_mod.sleep(0.01)
            stopped.append(stop.over)
        return real(c, phase, margins, deadline, warm, jobs, stop, before)

    monkeypatch.setattr(rounds, "_lower_side", slow)
    monkeypatch.setattr(rounds, "certified", record)
    got = fastlp.solve(dag, 0.9, None, margin=1)
    ref = solver.solve(dag, 0.9)
    for mine, theirs, rel in zip(got.phases, ref.phases, (PHASE1_REL, PHASE2_REL, PHASE3_REL)):
        assert mine.status == "OPTIMAL" and mine.objective == pytest.approx(theirs.objective, rel=rel)
    assert stopped == [True]
    assert calls.count(2) == 2
    assert duals["handed by 2"] == duals["round 1 of 2"] < duals["round 2 of 2"]


def test_a_warm_dual_that_has_not_finished_in_its_head_start_gives_way_to_the_race(monkeypatch) -> None:
    # Note [warm phase 3]: phase 3's tied dual from phase 2's basis runs alone for its head start (at least 1 s);
    # one still running then is interrupted, and the race of the two cold simplexes gives the dual.
    import time as time_mod

    dag = dag_mod.build(schedules.generate("1f1b", 6, 240), _random_profile(6, seed=21, p2p_ms=0.05))
    real, stalled = glop.solve_warm, []

    def stall(primal, basis, params, limit=None, **kwargs):
        if params != glop.DUAL_WARM_PARAMS:
            return real(primal, basis, params, limit, **kwargs)
        race = kwargs["race"]
        while not race.over:  # a slow warm start, until it is interrupted
            time_mod.sleep(0.01)
        stalled.append(1)
        return None

    monkeypatch.setattr(glop, "solve_warm", stall)  # glop.race's
    _assert_agrees(dag, 0.9)
    assert stalled == [1]


def test_phase_2s_margins_start_from_the_last_margins_point(monkeypatch) -> None:
    # Note [warm margins]: each grown margin's tied primal of phase 2 starts from the last margin's optimum
    # (tied.carried_point, tied.basis_of_point). Same certified optima as from scratch.
    dag = dag_mod.build(schedules.generate("1f1b", 8, 64), _random_profile(8, seed=2, p2p_ms=0.05))
    real, carried = rounds.basis_of_point, []

    def spy(primal, x):
        carried.append(len(x))
        return real(primal, x)

    monkeypatch.setattr(rounds, "basis_of_point", spy)
    warm = _assert_agrees(dag, 0.9, margin=1)
    assert len(carried) == 3, "phase 2's primal margin grew three times"
    monkeypatch.setattr(rounds, "basis_of_point", lambda primal, x: None)  # each margin from scratch
    cold = fastlp.solve(dag, 0.9, margin=1)
    assert cold.status == "OPTIMAL"
    assert [p.objective for p in warm.phases[:2]] == pytest.approx([p.objective for p in cold.phases[:2]], rel=1e-9)


def test_phase_3s_grown_margin_goes_through_phase_2(monkeypatch) -> None:
    # Note [phase 3 through phase 2]: on this instance phase 3 needs a margin phase 2 was not solved at. Its tied
    # primal starts from phase 2's point carried there and solved by the primal simplex (WARM_PARAMS), then from
    # that basis; its tied dual from phase 2's tied dual solved there, the warm dual simplex raced (keep_warm)
    # against the primal simplex from scratch. Same certified optima as phase 3's cold races there.
    dag = dag_mod.build(schedules.generate("1f1b", 6, 64), _random_profile(6, seed=4, p2p_ms=1.0))
    real_through, real_race, through, raced = rounds._through_phase2, rounds.race, [], []

    def spy_through(*args):
        job = real_through(*args)

        def spied():
            basis, spent = job()
            through.append((basis is not None, spent))
            return basis, spent

        return spied

    monkeypatch.setattr(rounds, "_through_phase2", spy_through)
    monkeypatch.setattr(rounds, "race", lambda *a, **k: raced.append(k.get("keep_warm")) or real_race(*a, **k))
    warm = _assert_agrees(dag, 0.9)
    assert len(through) == 1 and through[0][0] and through[0][1] > 0  # a basis, from phase 2's solve there
    assert raced == [False, True]  # round 1 from phase 2's handed dual as before; round 2 kept warm
    real_lower = rounds._lower_side
    monkeypatch.setattr(rounds, "_through_phase2", lambda *args: lambda: (None, 0))  # phase 3 cold there
    monkeypatch.setattr(rounds, "_lower_side", lambda *args: real_lower(*args[:7]))  # (its dual without phase 2)
    cold = fastlp.solve(dag, 0.9)
    assert cold.status == "OPTIMAL"
    assert [p.objective for p in warm.phases] == pytest.approx([p.objective for p in cold.phases], rel=PHASE3_REL)


def test_a_kept_warm_dual_races_the_primal_simplex_after_its_head_start(monkeypatch) -> None:
    # glop.race with keep_warm: the warm dual simplex is not stopped after its head start; the primal simplex from
    # scratch joins it, and the first result stops the other.
    import time as time_mod

    from tfplan.solve.fastlp.dual import tied_dual
    from tfplan.solve.lp import Deadline

    dag = dag_mod.build(schedules.generate("1f1b", 4, 32), _random_profile(4, seed=6))
    phase, c, opt = _phase_lps(dag, 0.9, 4)[2]
    lp_ = tied_dual(c, phase)
    basis = glop.solve_glop(lp_, basis=True).basis
    real, stopped = glop.solve_warm, []

    def stall(primal, basis, params, limit=None, **kwargs):  # a warm start slower than the cold one
        race = kwargs["race"]
        while not race.over:
            time_mod.sleep(0.01)
        stopped.append(True)
        return None

    monkeypatch.setattr(glop, "solve_warm", stall)
    got = glop.race(lp_, False, Deadline(limit_s=None), basis, head_start_s=0.05, basis=True, keep_warm=True)
    assert got is not None and got.dual_simplex is False and stopped == [True]
    assert got.objective == pytest.approx(opt, rel=1e-6, abs=1e-7)
    monkeypatch.setattr(glop, "solve_warm", real)
    got = glop.race(lp_, False, Deadline(limit_s=None), basis, head_start_s=30.0, basis=True, keep_warm=True)
    assert got is not None and got.dual_simplex is True  # within its head start: the warm one, alone

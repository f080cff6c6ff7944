"""tfplan.solve.fastlp.margins: the margin growing after a gap until the bounds meet, the primal's and the dual's
margins apart (Note [two margins]), lagging runs lifted to the median (Note [lagging runs]), phase 1's and phase
3's growth (Notes [phase 1's growth], [phase 3 growth]), and the dual's margin always tying something."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tfplan.solve.fastlp.instances import (
    PHASE1_REL,
    PHASE2_REL,
    PHASE3_REL,
    _assert_agrees,
    _random_profile,
)
from tfplan.cost import profile
from tfplan.schedule import schedules
from tfplan.solve import fastlp, solver
from tfplan.solve.fastlp import rounds
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.margins import Margins
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate


def test_margin_grows_until_the_bounds_meet() -> None:
    # Uniform 1F1B needs margins of about the stage count in phase 2 (fill and drain slack); starting
    # from margin 0 the tied primal is above the tied dual, and the margin must grow until they meet.
    dag = dag_mod.build(schedules.generate("1f1b", 6, 60), profile.uniform(6))
    ref = solver.solve(dag, 0.9)
    got = fastlp.solve(dag, 0.9, None, first_margin=0, margin=0)
    for mine, theirs, rel in zip(got.phases, ref.phases, (PHASE1_REL, PHASE2_REL, PHASE3_REL)):
        assert mine.objective == pytest.approx(theirs.objective, rel=rel)


def test_primal_and_dual_margins_grow_apart(monkeypatch) -> None:
    # Note [two margins]: on this instance phase 2's tied dual meets the optimum at the first margin while its
    # primal needs the next; phase 3 gets the dual's smaller margin, and when that is short the dual alone
    # grows, up to the primal's margin (the primal keeps phase 2's, and its basis). The optima are the
    # full LP's.
    dag = dag_mod.build(schedules.generate("1f1b", 4, 32), _random_profile(4, 6))
    ends, grown = [], []
    certified, grow, grow_dual, basis = rounds.certified, Margins.grow, Margins.grow_dual, rounds.phase3_basis
    warm = []

    def record(phase, margins, *args):
        out = certified(phase, margins, *args)
        ends.append((phase.number, int(sum(m.sum() for m in margins.current)), int(sum(m.sum() for m in margins.dual))))
        return out

    monkeypatch.setattr(rounds, "certified", record)
    monkeypatch.setattr(Margins, "grow", lambda self, m: grown.append("primal") or grow(self, m))
    monkeypatch.setattr(Margins, "grow_dual", lambda self, cap=None: grown.append("dual") or grow_dual(self, cap))
    monkeypatch.setattr(rounds, "phase3_basis", lambda *args: warm.append(True) or basis(*args))
    got = fastlp.solve(dag, 0.9, None, margin=1)
    ref = solver.solve(dag, 0.9)
    for mine, theirs, rel in zip(got.phases, ref.phases, (PHASE1_REL, PHASE2_REL, PHASE3_REL)):
        assert mine.status == "OPTIMAL" and mine.objective == pytest.approx(theirs.objective, rel=rel)
    (_, p1, _), (_, p2, d2), (_, p3, d3) = ends
    assert d2 < p2  # phase 2's dual certified at a smaller margin than its primal's, and handed it on
    # phase 3: the dual grew alone (by half, Note [phase 3 growth]), at most to the primal's margin; the primal kept
    # phase 2's margin
    assert p3 == p2 and d2 < d3 < p3  # (doubling would have reached the primal's)
    assert grown == ["dual", "primal", "dual"]  # phase 2 grew both once, phase 3 the dual alone
    assert warm == [True]  # phase 3's primal started from phase 2's basis (its compression kept while the dual's grew)


def test_a_lagging_run_catches_up_with_the_median_in_phases_2_and_3() -> None:
    # Note [lagging runs]: in phases 2-3 a grown margin lifts each end of every run to at least the median over
    # the runs of that end's grown value (2 m + 1; phase 3 ceil(1.5 m) + 1, Note [phase 3 growth]), the primal's
    # and the dual's alike; runs at or above it grow as before, and phase 1 only doubles (its floor, Note [phase
    # 1's growth], is where phases 2-3 start: 1 period here).
    dag = dag_mod.build(schedules.generate("1f1b", 8, 96), _random_profile(8, seed=2))
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    k = runs.num_runs
    assert k >= 3
    for phase in (1, 2, 3):
        margins = Margins(dag, g, runs, 1, 1, simulate(dag).start_ms)
        margins.start(phase)
        head, tail = np.full(k, 3), np.full(k, 2)
        head[0], tail[0] = 0, 0  # run 0 lags at both ends
        head[1], tail[1] = 10, 9  # run 1 is ahead
        margins.current = margins.dual = (head, tail)
        for grown in (margins.grow((head, tail)), margins.dual if margins.grow_dual() else None):
            assert grown is not None
            heads, tails = ((1, 21, 7), (1, 19, 5)) if phase == 1 else ((7, 21, 7), (5, 19, 5)) if phase == 2 \
                else ((6, 16, 6), (4, 15, 4))  # (run 0, run 1, the others)
            assert grown[0].tolist() == [heads[0], heads[1]] + [heads[2]] * (k - 2)
            assert grown[1].tolist() == [tails[0], tails[1]] + [tails[2]] * (k - 2)


def test_lifting_a_lagging_run_saves_growths(monkeypatch) -> None:
    # Note [lagging runs], end to end: on this instance phases 2-3 start from aligned margins where a run lags;
    # doubling alone grew the margins three times each (primal and dual), the median lift twice. The optima
    # are the full LP's either way.
    dag = dag_mod.build(schedules.generate("1f1b", 8, 64), _random_profile(8, seed=2))
    grow, grow_dual = Margins.grow, Margins.grow_dual
    growths = []
    monkeypatch.setattr(Margins, "grow", lambda self, m: growths.append("primal") or grow(self, m))
    monkeypatch.setattr(Margins, "grow_dual", lambda self, cap=None: growths.append("dual") or grow_dual(self, cap))
    lifted = _assert_agrees(dag, 0.9)
    with_lift, growths[:] = list(growths), []
    monkeypatch.setattr(Margins, "_widened", lambda self, m: (2 * m[0] + 1, 2 * m[1] + 1))
    plain = fastlp.solve(dag, 0.9)
    assert plain.status == "OPTIMAL"
    assert [p.objective for p in plain.phases] == pytest.approx([p.objective for p in lifted.phases], rel=PHASE3_REL)
    assert (with_lift.count("primal"), with_lift.count("dual")) == (2, 2)
    assert (growths.count("primal"), growths.count("dual")) == (3, 3)


def test_the_dual_margin_always_ties_something() -> None:
    # Margins.start: the dual's margin is the per-run maximum of the handed-on one and the phase's start, which
    # can tie nothing where the primal's still ties; the dual then starts at the primal's. A capped catch-up
    # never shrinks a run where the dual is ahead.
    dag = dag_mod.build(schedules.generate("zbv", 4, 16), _random_profile(8, 1))
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    fell_back = 0
    for first in range(0, 6):
        margins = Margins(dag, g, runs, 0, None, simulate(dag).start_ms)
        handed = (np.full(runs.num_runs, first), np.full(runs.num_runs, first))
        margins.dual = handed
        primal = margins.start(2)
        if primal is not None:
            assert runs.ties(g.n, margins.dual).num_tied > 0
            raw = (np.maximum(handed[0], primal[0]), np.maximum(handed[1], primal[1]))
            fell_back += runs.ties(g.n, raw).num_tied == 0
            ahead = (margins.dual[0] + 1, margins.dual[1] + 1)
            margins.dual = ahead
            if margins.grow_dual(cap=primal):
                assert np.all(margins.dual[0] >= ahead[0]) and np.all(margins.dual[1] >= ahead[1])
    assert fell_back  # the case this guards against occurs here


def test_a_dual_a_few_periods_behind_is_not_caught_up_alone() -> None:
    # Note [catch-up rounds]: a dual behind the primal's margin by at least CATCH_UP_SHARE of its periods grows
    # alone, capped at the primal's (caught_up: its value then says nothing of growth); one behind by fewer
    # follows Note [two margins] at once (both grow when neither side has moved yet).
    from tfplan.solve.fastlp.margins import CATCH_UP_SHARE

    dag = dag_mod.build(schedules.generate("1f1b", 8, 96), _random_profile(8, seed=2))
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    k = runs.num_runs
    for behind, caught in ((int(CATCH_UP_SHARE * 2 * 3 * k) + 1, True), (1, False)):
        margins = Margins(dag, g, runs, 3, None, simulate(dag).start_ms)
        margins.start(1)
        primal = margins.current
        margins.dual = (primal[0].copy(), primal[1].copy())
        margins.dual[0][:behind] -= 1  # the dual behind by `behind` periods
        margins._catch_up = True
        assert margins.advance(True, True) == ((False, True) if caught else (True, True))
        assert margins.caught_up == caught


def test_phase_1_grows_at_once_to_where_phases_2_and_3_start() -> None:
    # Note [phase 1's growth]: phase 1 starts at `first` periods; at its first gap it grows at least to where
    # phases 2-3 start (the cheaper of the stage count and the time-aligned margins), not merely to 2 m + 1.
    dag = dag_mod.build(schedules.generate("1f1b", 8, 96), _random_profile(8, seed=2))
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    start_ms = simulate(dag).start_ms
    later = Margins(dag, g, runs, 0, None, start_ms).start(2)  # from 0 periods: exactly where phases 2-3 start
    margins = Margins(dag, g, runs, 2, None, start_ms)
    first = margins.start(1)
    assert first[0].tolist() == [2] * runs.num_runs and first[1].tolist() == [2] * runs.num_runs
    grown = margins.grow(first)
    assert grown is not None
    for end in (0, 1):
        assert np.all(grown[end] >= later[end]) and np.all(grown[end] >= 5)
    assert max(grown[0].max(), grown[1].max()) > 5  # the jump is past doubling on this instance

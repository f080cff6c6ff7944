"""tfplan.solve.fastlp.tied and dual: the tied primal and the tied dual sandwich the optimum whatever the ties
(Note [periodic compression]), a compression used before gives the same tied dual, a point carried to a larger
margin, the tied dual's incidence, and dense ids."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tfplan.solve.fastlp.instances import (
    COMPRESSED,
    _phase_lps,
    _random_profile,
)
from tfplan.schedule import schedules
from tfplan.solve import lp, solver
from tfplan.solve.fastlp.dual import _incidence, _sorted_rows, tied_dual
from tfplan.solve.fastlp.glop import solve_glop
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.tied import Compressed, Phase, tied_primal
from tfplan.step import dag as dag_mod


@pytest.mark.parametrize("margin", [0, 1, 3])
def test_tied_lps_sandwich_the_optimum_for_any_ties(margin: int) -> None:
    # Note [periodic compression]: the tied primal is a restriction (>= OPT), the tied dual a restriction
    # of the dual (<= OPT), whatever the ties; equality is what certifies a phase.
    dag = dag_mod.build(schedules.generate("1f1b", 4, 30), _random_profile(4, seed=3, p2p_ms=0.1))
    ref = solver.solve(dag, 0.8)
    g = GraphArrays.from_dag(dag)
    c = Compressed(g, Runs.detect(g).ties(g.n, (margin, margin)))
    caps = np.full(4, 0.8)
    t_ub = lp.makespan_bound(ref.makespan_ms, None)
    r_ub = lp.total_bound(ref.phases[1].objective)
    phases = [
        Phase(number=1, caps=caps),
        Phase(number=2, caps=caps, t_ub=t_ub),
        Phase(number=3, caps=caps, t_ub=t_ub, r_ub=r_ub),
    ]
    for phase, opt in zip(phases, [p.objective for p in ref.phases]):
        upper, lower = solve_glop(tied_primal(c, phase)), solve_glop(tied_dual(c, phase))
        assert upper is None or upper.objective >= opt - 1e-7 * max(1, opt)  # None: infeasible, +inf
        assert lower.objective <= opt + 1e-7 * max(1, opt)


def test_the_tied_dual_is_the_same_from_a_compression_used_before() -> None:
    # tfplan.solve.fastlp.dual keeps the kept rows of a compression in Compressed.memo for every later phase: each
    # phase's tied dual equals the one built from a fresh compression, in every order the phases ask for them.
    sched = schedules.generate("zbv", 2, 33, 2)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=3, p2p_ms=0.07))
    phases_ = [phase for phase, _, _ in _phase_lps(dag, 0.8, 2)]
    g = GraphArrays.from_dag(dag)
    ties = Runs.detect(g).ties(g.n, (2, 2))
    shared = Compressed(g, ties)
    for phase in phases_ + phases_[::-1]:
        got, fresh = tied_dual(shared, phase), tied_dual(Compressed(g, ties), phase)
        for field in ("obj", "lb", "ub", "ri", "ci", "val", "row_lo", "row_hi"):
            assert np.array_equal(getattr(got, field), getattr(fresh, field)), field
    assert len(shared.memo) == 1


def test_a_carried_point_keeps_its_rows_and_its_objective_at_a_larger_margin() -> None:
    # tied.carried_point: phase 2's optimum at margin 2, expanded and tied again at margin 5, satisfies every
    # row and bound of the larger tied primal with the same objective; tied.basis_of_point gives a square basis.
    from tfplan.solve.fastlp.tied import basis_of_point, carried_point

    dag = dag_mod.build(schedules.generate("1f1b", 8, 64), _random_profile(8, seed=2, p2p_ms=0.05))
    phase2 = _phase_lps(dag, 0.9, 1)[1][0]
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    small, large = Compressed(g, runs.ties(g.n, (2, 2))), Compressed(g, runs.ties(g.n, (5, 5)))
    assert small.ties.num_tied > large.ties.num_tied > 0
    before = solve_glop(tied_primal(small, phase2), lp.GLOP_PARAMS)
    primal = tied_primal(large, phase2)
    x = carried_point(small, before.x, large)
    activity = np.bincount(primal.ri, weights=primal.val * x[primal.ci], minlength=len(primal.row_lo))
    tol = 1e-9 * np.maximum(1.0, np.abs(activity))
    assert np.all(activity >= primal.row_lo - tol) and np.all(activity <= primal.row_hi + tol)
    assert np.all(x >= primal.lb - 1e-12) and np.all(x <= primal.ub + 1e-12)
    assert float(primal.obj @ x) == pytest.approx(before.objective, rel=1e-12)
    cols, rows = basis_of_point(primal, x)
    assert np.count_nonzero(cols == 5) + np.count_nonzero(rows == 5) == len(primal.row_lo)


@pytest.mark.parametrize("top", [50, 10**12])
def test_dense_ids_are_np_uniques(top: int) -> None:
    # tied._dense_ids: by counting when the keys' range is small, by np.unique when it is not; the same ids.
    from tfplan.solve.fastlp.tied import _dense_ids

    key = np.random.default_rng(top % 97).integers(0, top, 5000)
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    ids, sizes = _dense_ids(key)
    assert np.array_equal(ids, inverse.ravel()) and np.array_equal(sizes, counts)


@pytest.mark.parametrize("kind, stages, microbatches, virtual", COMPRESSED)
def test_the_incidence_lists_each_nodes_row_groups(kind: str, stages: int, microbatches: int, virtual) -> None:
    # tfplan.solve.fastlp.dual._incidence places the rows by the graph's row levels (kept in g.memo) and sorts width
    # 2 by min/max: per node, its in-rows' groups and its out-rows' groups (and a sink's kappa column), padded with
    # -1 and sorted (padding first), as a loop over the rows lists them; the same from a second compression.
    sched = schedules.generate(kind, stages, microbatches, virtual) if virtual else schedules.generate(
        kind, stages, microbatches)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=5, p2p_ms=0.05))
    g = GraphArrays.from_dag(dag)
    for margin in (0, 2):
        c = Compressed(g, Runs.detect(g).ties(g.n, (margin, margin)))
        sink_var = 10_000 + np.arange(len(g.sinks))
        got_in, got_out = _incidence(c, sink_var)
        ins, outs = [[] for _ in range(g.n)], [[] for _ in range(g.n)]
        for row, (u, v) in enumerate(zip(g.row_u.tolist(), g.row_v.tolist())):
            ins[v].append(int(c.row_group[row]))
            outs[u].append(int(c.row_group[row]))
        for sink, var in zip(g.sinks.tolist(), sink_var.tolist()):
            outs[sink].append(var)
        for got, want in ((got_in, ins), (got_out, outs)):
            width = max(1, max(map(len, want)))
            assert got.shape == (g.n, width)
            assert got.tolist() == [sorted(w + [-1] * (width - len(w))) for w in want]


@pytest.mark.parametrize("width", [1, 2, 3])
def test_sorted_rows_is_np_sort_by_row(width: int) -> None:
    mat = np.random.default_rng(width).integers(-1, 5, size=(50, width))
    assert np.array_equal(_sorted_rows(mat), np.sort(mat, axis=1))

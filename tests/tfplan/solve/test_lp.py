"""What both backends share (tfplan.solve.lp), through the reference backend: per-stage caps and bad caps,
unreachable targets and a target just below the optimum, the precedence rows, the time limit."""

from __future__ import annotations

import pytest

from tests.tfplan.solve.instances import CAP_TOL, _hetero, _stage_means, _toy_dag
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.solve import lp, solver
from tfplan.step import dag as dag_mod


def test_per_stage_caps() -> None:
    dag = _toy_dag("1f1b")
    caps = [0.0, 0.2, 0.5, 1.0]
    sol = solver.solve(dag, caps)
    means = _stage_means(dag, sol.ratios)
    for mean, cap in zip(means, caps):
        assert mean <= cap + CAP_TOL
    assert means[0] == 0.0
    assert all(sol.ratios[v] == 0.0 for v, a in enumerate(dag.actions) if a.stage == 0)
    # A single-element list means every stage.
    assert solver.solve(dag, [0.5]).makespan_ms == pytest.approx(solver.solve(dag, 0.5).makespan_ms, rel=1e-12)
    assert lp.check_caps([0.5], 3) == [0.5, 0.5, 0.5]
    assert lp.check_caps(1, 2) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ([0.5, 0.5], "got 2 per-stage caps but the schedule has 4 stages"),
        ([0.5] * 5, "got 5 per-stage caps but the schedule has 4 stages"),
        (1.5, r"cap of stage 0 must be in \[0, 1\], got 1.5"),
        (-0.1, r"cap of stage 0 must be in \[0, 1\], got -0.1"),
        ([0.5, 0.5, 2.0, 0.5], r"cap of stage 2 must be in \[0, 1\], got 2"),
        (float("nan"), r"must be in \[0, 1\], got nan"),
    ],
)
def test_bad_caps(caps, message: str) -> None:
    with pytest.raises(TfplanError, match=message):
        solver.solve(_toy_dag("gpipe"), caps)


def test_target_below_optimum_is_unreachable() -> None:
    dag = _toy_dag("1f1b")
    with pytest.raises(lp.UnreachableTarget) as info:
        solver.solve(dag, 0.9, target_makespan_ms=22.5)
    assert info.value.best_makespan_ms == pytest.approx(22.8, rel=1e-9)
    assert "unreachable" in str(info.value)
    assert isinstance(info.value, TfplanError)


def test_precedence_rows_drop_only_redundant_same_stage_edges() -> None:
    dag = dag_mod.build(schedules.generate("zbv", 2, 3), _hetero(4))
    rows, finish = lp.precedence_rows(dag)
    kept = {(u, v) for u, v, _ in rows}
    for u, v, _, kind in dag.edges():
        if kind == "stage":
            continue  # implied by the rank chain on the same rank
        assert (u, v) in kept
    sinks = {v for v in range(dag.num_nodes) if all(u != v for u, _, _, _ in dag.edges())}
    last = {r: max(v for v in range(dag.num_nodes) if dag.rank[v] == r) for r in range(dag.schedule.num_ranks)}
    assert sorted(u for u, _ in finish) == sorted(sinks) and sinks <= set(last.values())  # no tails here


def test_a_target_just_below_the_optimum_is_the_optimum() -> None:
    # tfplan.solve.lp.makespan_bound: a target in [T1 (1 - 1e-9), T1) is T1 (the fastest plan), not unreachable.
    dag = _toy_dag("1f1b")
    best = solver.solve(dag, 0.9)
    sol = solver.solve(dag, 0.9, target_makespan_ms=22.8 * (1 - 0.5e-9))
    assert sol.status == "OPTIMAL"
    assert [p.objective for p in sol.phases] == [p.objective for p in best.phases]  # as without a target
    with pytest.raises(lp.UnreachableTarget):
        solver.solve(dag, 0.9, target_makespan_ms=22.8 * (1 - 2e-9))


def test_time_limit_is_a_clear_error() -> None:
    dag = dag_mod.build(schedules.generate("1f1b", 8, 128), _hetero(8))  # GLOP needs about 0.5 s
    with pytest.raises(TfplanError, match=r"^--time-limit: GLOP reached the limit of 0\.001 s (before|in) LP phase"):
        solver.solve(dag, 0.9, time_limit_s=0.001)
    for bad in (0.0, 1e18):  # (1e18 s overflowed GLOP's int64 milliseconds)
        with pytest.raises(TfplanError, match="--time-limit: must be a positive number of seconds up to 1e"):
            solver.solve(dag, 0.9, time_limit_s=bad)
    sol = solver.solve(_toy_dag("gpipe"), 0.9, time_limit_s=60.0)
    assert sol.status == "OPTIMAL" and sol.time_limit_s == 60.0
    assert all(p.gap is None for p in sol.phases)  # GLOP certifies by its own status (Note [LP certificate])

"""tfplan.solve.fastlp.graph: the LP's precedence rows as arrays, runs that tie equal actions one period apart,
and the period that ties the most actions."""

from __future__ import annotations

import numpy as np
import pytest

from tfplan.cost import profile
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.solve.fastlp.graph import GraphArrays, Runs, levels
from tfplan.step import dag as dag_mod


@pytest.mark.parametrize("name", list(schedules.SCHEDULES))
def test_rows_are_the_solver_rows(name: str) -> None:
    spec = schedules.get_spec(name)
    sched = schedules.generate(name, 3, 12, spec.default_stages_per_rank)
    dag = dag_mod.build(sched, profile.uniform(sched.num_stages, p2p_ms=0.2))
    g = GraphArrays.from_dag(dag)
    rows, finish = lp.precedence_rows(dag)
    assert sorted(rows) == sorted(zip(g.row_u.tolist(), g.row_v.tolist(), g.row_lag.tolist()))
    assert sorted(finish) == list(zip(g.sinks.tolist(), g.sink_tail.tolist()))


def test_runs_tie_equal_actions_one_period_apart() -> None:
    dag = dag_mod.build(schedules.generate("interleaved-1f1b", 3, 30, 2), profile.uniform(6))
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    ties = runs.ties(g.n, (2, 2))
    tied = np.flatnonzero(ties.rep != np.arange(g.n))
    assert len(tied) > 0
    assert np.all(g.cls[tied] == g.cls[ties.rep[tied]])
    assert np.all(g.mb[tied] == g.mb[ties.rep[tied]] + runs.period_mb * ties.off[tied])
    assert np.all(g.d_max[tied] == g.d_max[ties.rep[tied]]) and np.all(g.delta[tied] == g.delta[ties.rep[tied]])


def test_the_period_is_the_one_that_ties_most_actions() -> None:
    # Interleaved 1F1B repeats with a period of one round (P micro-batches); shifted by one micro-batch its
    # chains break at every round: they cover 92% of 16 x 512 but tie under half of it at phase 1's margin.
    from tfplan.solve.fastlp.graph import FIRST_MARGIN

    sched = schedules.generate("interleaved-1f1b", 16, 512)
    g = GraphArrays.from_dag(dag_mod.build(sched, profile.uniform(sched.num_stages)))
    runs = Runs.detect(g)
    margin = (FIRST_MARGIN, FIRST_MARGIN)
    assert runs.period_mb == 16 and runs.ties(g.n, margin).num_tied >= 0.8 * g.n
    for q in (1, 2, 32):
        assert Runs._chains(g, q, 4).ties(g.n, margin).num_tied < runs.ties(g.n, margin).num_tied
    assert len(Runs._chains(g, 1, 4).nodes) > 0.9 * g.n  # what the old rule (coverage) went by


def test_levels_split_repeated_targets() -> None:
    index = np.array([3, 1, 3, 3, 0, 1])
    groups = levels(index)
    assert sorted(np.concatenate(groups).tolist()) == list(range(6)) and len(groups) == 3
    assert all(len(set(index[g].tolist())) == len(g) for g in groups)
    assert levels(np.zeros(0, np.int64)) == []

"""tfplan.plan.job: the stage-0 anchor (Note [stage-0 anchor]) on every schedule, against the unanchored LP."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import PROFILES
from tfplan.cost import profile
from tfplan.plan import job
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev"]


def _dag(name: str, ranks: int, m: int, prof: profile.Profile) -> dag_mod.Dag:
    v = schedules.get_spec(name).default_stages_per_rank
    return dag_mod.build(schedules.generate(name, ranks, m, v), prof)


def _makespan(dag: dag_mod.Dag, solution: lp.Solution) -> float:
    return simulate(dag, dag.durations(solution.ratios)).batch_time_ms


def test_gpipe_chain_gives_up_the_closed_form_share() -> None:
    # GPipe, 2 stages, uniform costs, cap 0.9: every stage-0 backward lies on the step's last chain, so the
    # unanchored LP freezes them all (sum 0.9 x 4 = 3.6 backwards' saving); anchored, three rise to 1 and one
    # stays at 0 (sum 3), giving up 0.6 of one backward's saving (1 ms: B 2 ms unfrozen, 1 ms frozen).
    dag = _dag("gpipe", 2, 4, profile.uniform(2))
    free = job.solve_dag(dag, 0.9, anchor=False)
    anchored = job.solve_dag(dag, 0.9)
    stage0 = dag.freeze_groups()[0]
    assert min(free.ratios[v] for v in stage0) > job.ANCHOR_TOL
    assert sorted(anchored.ratios[v] for v in stage0) == pytest.approx([0.0, 1.0, 1.0, 1.0], abs=1e-6)
    assert _makespan(dag, anchored) - _makespan(dag, free) == pytest.approx(0.6, abs=1e-6)
    assert anchored.makespan_ms == pytest.approx(_makespan(dag, anchored), rel=1e-8)  # phases 2-3: T1 (1 + REL_TOL)
    assert anchored.durations == dag.durations(anchored.ratios)
    assert max(lp.cap_excess(dag, anchored.ratios, [0.9, 0.9])) <= lp.CAP_TOL


def test_a_plan_that_leaves_one_unfrozen_is_unchanged() -> None:
    # The shipped tiny profile on 1F1B: the LP already leaves stage 0's micro-batch 6 unfrozen.
    spec = job.JobSpec(profile_path=str(PROFILES / "tiny-cpu-2stages.json"), schedule="1f1b", num_microbatches=8)
    _, _, dag = job.build(spec)
    free, anchored = job.solve_dag(dag, 0.9, anchor=False), job.solve_dag(dag, 0.9)
    assert job.anchor_node(dag, free.ratios) is None
    assert anchored.ratios == free.ratios


def test_one_micro_batch_is_not_anchored() -> None:
    # With a single stage-0 backward the anchor would forbid freezing stage 0 at all: none is kept.
    dag = _dag("gpipe", 2, 1, profile.uniform(2))
    assert job.solve_dag(dag, 0.9).ratios == job.solve_dag(dag, 0.9, anchor=False).ratios


def test_unreachable_target_with_the_anchor_keeps_the_unanchored_plan() -> None:
    dag = _dag("gpipe", 2, 4, profile.uniform(2))
    free = job.solve_dag(dag, 0.9, anchor=False)
    target = _makespan(dag, free) + 0.1  # only the unanchored plan (0.6 ms faster than the anchored) meets it
    planned = job.solve_dag(dag, 0.9, target)
    assert _makespan(dag, planned) <= target + 1e-9
    assert min(planned.ratios[v] for v in dag.freeze_groups()[0]) > job.ANCHOR_TOL


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SCHEDULES), ranks=st.integers(2, 3), rounds=st.integers(1, 3),
       cap=st.sampled_from([0.3, 0.5, 0.9, 1.0]), backend=st.sampled_from(["glop", "fastlp"]))
def test_anchored_plans_on_every_schedule(name: str, ranks: int, rounds: int, cap: float, backend: str) -> None:
    v = schedules.get_spec(name).default_stages_per_rank
    prof = profile.load(PROFILES / "toy-hetero-4.json") if ranks * v == 4 else profile.uniform(ranks * v, p2p_ms=0.1)
    m = ranks * v * rounds  # a count every schedule accepts
    dag = _dag(name, ranks, m, prof)
    free = job.solve_dag(dag, cap, backend=backend, anchor=False)
    anchored = job.solve_dag(dag, cap, backend=backend)
    stage0 = dag.freeze_groups()[0]
    # Stage 0 keeps an unfrozen backward, every cap holds over the original groups, and the anchor costs at
    # most one stage-0 backward's saving (the unanchored ratios with the pinned one at 0 are feasible).
    assert min(anchored.ratios[v] for v in stage0) <= job.ANCHOR_TOL
    assert max(lp.cap_excess(dag, anchored.ratios, [cap] * dag.schedule.num_stages)) <= lp.CAP_TOL
    span = max(dag.d_max[v] - dag.d_min[v] for v in stage0)
    assert _makespan(dag, anchored) <= (_makespan(dag, free) + span) * (1 + 1e-8)  # LP tolerances (lp.REL_TOL)
    if job.anchor_node(dag, free.ratios) is None:  # nothing to anchor: the same optimum (fastlp may break ties
        assert _makespan(dag, anchored) == pytest.approx(_makespan(dag, free), rel=1e-8)  # differently per call)
        if backend == "glop":
            assert anchored.ratios == free.ratios


def test_the_time_limit_covers_the_anchored_solve(monkeypatch, caplog) -> None:
    # --time-limit holds for the whole solve: the anchored solve gets what the first one left, and when that
    # is (almost) nothing the unanchored plan is kept with a warning.
    dag = dag_mod.build(schedules.generate("gpipe", 2, 4), profile.uniform(2))
    limits = []
    real = job._solve_backend

    def recording(d, caps, target, backend, time_limit_s, *known):
        limits.append(time_limit_s)
        return real(d, caps, target, backend, time_limit_s, *known)

    monkeypatch.setattr(job, "_solve_backend", recording)
    anchored = job.solve_dag(dag, 0.9, time_limit_s=50.0)
    assert len(limits) == 2 and limits[0] == 50.0 and 45.0 < limits[1] < 50.0
    assert min(anchored.ratios[v] for v in dag.freeze_groups()[0]) == 0.0
    clock = iter([0.0, 49.0])  # the first solve took 49 of the 50 seconds
    monkeypatch.setattr(job, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    limits.clear()
    with caplog.at_level(logging.WARNING, logger="tfplan.plan.job"):
        free = job.solve_dag(dag, 0.9, time_limit_s=50.0)
    assert limits == [50.0] and "no time left to keep a stage-0 backward unfrozen" in caplog.text
    assert min(free.ratios[v] for v in dag.freeze_groups()[0]) > 0.0

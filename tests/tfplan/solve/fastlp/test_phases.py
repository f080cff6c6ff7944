"""fastlp.solve against solver.solve (GLOP on the full LP) end to end: METHOD.md toy numbers, every schedule with
repeating micro-batches (so the compression is really used), heterogeneous profiles with p2p lag, caps 0 and 1
and per-stage caps, targets, random instances, an independent LP, the plan's checks and retries, the time limit."""

from __future__ import annotations

import json
import logging
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import PROFILES
from tests.tfplan.solve.fastlp.instances import (
    COMPRESSED,
    EXAMPLES,
    PHASE2_REL,
    PHASE3_REL,
    _assert_agrees,
    _random_profile,
    random_dags,
)
from tfplan.cost import profile
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.solve import fastlp, lp
from tfplan.solve.fastlp import phases, rounds
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.margins import Margins
from tfplan.solve.fastlp.tied import Compressed
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate


def _toy_dag(name: str, m: int = 8) -> dag_mod.Dag:
    return dag_mod.build(schedules.generate(name, 4, m), profile.load(PROFILES / "toy-uniform-4.json"))


TOY = [
    ("gpipe", 0.3, 28.05), ("gpipe", 0.5, 26.0), ("gpipe", 0.7, 24.4), ("gpipe", 0.9, 22.8), ("gpipe", 1.0, 22.0),
    ("1f1b", 0.3, 27.6), ("1f1b", 0.5, 26.0), ("1f1b", 0.7, 24.4), ("1f1b", 0.9, 22.8), ("1f1b", 1.0, 22.0),
]


@pytest.mark.parametrize(("name", "cap", "expected"), TOY, ids=[f"{n}-{c}" for n, c, _ in TOY])
def test_method_toy_numbers(name: str, cap: float, expected: float) -> None:
    dag = _toy_dag(name)
    sol = _assert_agrees(dag, cap)
    assert sol.makespan_ms == pytest.approx(expected, rel=1e-9)
    assert simulate(dag, sol.durations).makespan_ms == pytest.approx(expected, rel=1.1e-9)


@pytest.mark.parametrize(("name", "p", "m", "v"), COMPRESSED, ids=[c[0] for c in COMPRESSED])
@pytest.mark.parametrize("cap", [0.0, 0.5, 0.9, 1.0])
def test_agrees_with_glop_where_micro_batches_repeat(name: str, p: int, m: int, v: int | None, cap: float) -> None:
    sched = schedules.generate(name, p, m, v)
    seed = zlib.crc32(f"{name}-{cap}".encode()) % 1000  # not hash(): str hashes change from run to run
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=seed, p2p_ms=0.07))
    g = GraphArrays.from_dag(dag)
    ties = Runs.detect(g).ties(g.n, (sched.num_stages, sched.num_stages))
    assert ties.num_tied > g.n // 3, "the test instance should exercise the compression"
    _assert_agrees(dag, cap)


def test_uniform_1f1b_compresses_to_a_small_lp() -> None:
    dag = dag_mod.build(schedules.generate("1f1b", 6, 240), profile.uniform(6))
    g = GraphArrays.from_dag(dag)
    c = Compressed(g, Runs.detect(g).ties(g.n, (6, 6)))
    assert len(c.free_nodes) < 0.15 * g.n
    _assert_agrees(dag, 0.9)


def test_per_stage_caps_and_targets() -> None:
    dag = dag_mod.build(schedules.generate("1f1b", 3, 30), _random_profile(3, seed=7, p2p_ms=0.05))
    caps = [0.2, 0.9, 0.6]
    best = _assert_agrees(dag, caps).makespan_ms
    _assert_agrees(dag, caps, target=best * 1.03)
    _assert_agrees(dag, caps, target=best)
    with pytest.raises(TfplanError, match="unreachable"):
        fastlp.solve(dag, caps, target_makespan_ms=best * 0.99)
    with pytest.raises(TfplanError):
        fastlp.solve(dag, [0.5, 0.5])


def test_plan_retries_end_with_the_best_plan(monkeypatch, caplog) -> None:
    # Note [LP tolerance]: a plan whose re-simulated makespan looks too long is re-solved (tighter
    # tolerance, then the full LP); if none fits, the shortest is kept with a warning. Make every plan
    # look too long to run all of that.
    real = phases.simulate

    def too_long(d, durations=None):
        sim = real(d, durations)
        return SimpleNamespace(start_ms=sim.start_ms, makespan_ms=2 * sim.makespan_ms)

    monkeypatch.setattr(phases, "simulate", too_long)
    dag = dag_mod.build(schedules.generate("1f1b", 3, 30), _random_profile(3, seed=11))
    with caplog.at_level(logging.WARNING, logger="tfplan.solve.fastlp"):
        _assert_agrees(dag, 0.9)
    assert "misses its makespan or total-freeze bound" in caplog.text


def test_the_plan_is_simulated_with_its_caps_kept(monkeypatch) -> None:
    # _plan scales a stage whose mean ratio exceeds its cap by GLOP's tolerance (lp.keep_caps) before it
    # simulates the plan: the simulation checked against T1 is the returned plan's, and tfplan.plan.plan's
    # predictions find it in the Dag's memo. Every ratio is nudged up by 1e-12 to make the binding caps exceed.
    real = phases.expand_ratios
    monkeypatch.setattr(phases, "expand_ratios", lambda c, x: np.minimum(real(c, x) * (1 + 1e-12), 1.0))
    dag = dag_mod.build(schedules.generate("1f1b", 4, 24), _random_profile(4, seed=3))
    sol = fastlp.solve(dag, 0.3)
    means = [sum(sol.ratios[v] for v in group) / len(group) for group in dag.freeze_groups() if group]
    assert max(means) == pytest.approx(0.3, abs=1e-12) and max(means) <= 0.3 + 1e-15  # a cap binds, and is kept
    kept = dag.memo["last"]
    assert kept[0] == dag.durations(sol.ratios)
    assert simulate(dag, dag.durations(sol.ratios)) is kept[1]


def test_plan_keeps_the_total_freeze_allowance() -> None:
    # Found in review: GLOP's dual simplex with presolve returned a phase-3 point whose total freeze was
    # 2x over R2's allowance (R2 (1 + 1e-9) + 1e-9) with the makespan fine; the plan check must see the total
    # too and re-solve (_assert_agrees checks sum(ratios) against R2).
    dag = dag_mod.build(schedules.generate("1f1b", 6, 18), profile.uniform(6, p2p_ms=0.05))
    _assert_agrees(dag, [0.0, 0.0, 0.1, 0.0, 0.1, 0.25])


def test_a_target_plan_fits_without_retries(caplog) -> None:
    # Found in review: phase 2 pushes T up to the target exactly, so the makespan bound on the plan needs a
    # relative tolerance above the target, or every solve with a target ran every retry and warned.
    dag = dag_mod.build(schedules.generate("1f1b", 4, 64), profile.uniform(4))
    best = fastlp.solve(dag, 0.9).makespan_ms
    with caplog.at_level(logging.DEBUG, logger="tfplan.solve.fastlp"):
        _assert_agrees(dag, 0.9, target=best * 1.05)
    assert "re-solving the last phase" not in caplog.text and "misses" not in caplog.text


CAP_CHOICES = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0]


# FASTLP_EXAMPLES=2000 for a longer hunt (the default keeps the file under a minute).
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dag=random_dags(max_ranks=3, max_mbs=26),
    caps=st.one_of(st.sampled_from(CAP_CHOICES), st.lists(st.sampled_from(CAP_CHOICES), min_size=6, max_size=6)),
)
def test_agrees_with_glop_on_random_instances(dag, caps) -> None:
    if isinstance(caps, list):
        caps = caps[: dag.schedule.num_stages]
        assume(len(caps) == dag.schedule.num_stages)
    _assert_agrees(dag, caps)


@pytest.mark.parametrize(("name", "p", "m", "v"), COMPRESSED, ids=[c[0] for c in COMPRESSED])
def test_three_phases_agree_with_an_independent_lp(name: str, p: int, m: int, v: int | None) -> None:
    # All seven schedules: the phase values are the optima of METHOD.md's LP written afresh for scipy's HiGHS.
    from tests.tfplan.solve.independent_lp import _independent_lp

    sched = schedules.generate(name, p, m, v)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed=zlib.crc32(name.encode()) % 1000, p2p_ms=0.07))
    got = fastlp.solve(dag, 0.9)
    ref = _independent_lp(dag, [0.9] * sched.num_stages)
    assert got.phases[0].objective == pytest.approx(ref.makespan, rel=1e-9)
    assert got.phases[1].objective == pytest.approx(ref.total_ratio, rel=PHASE2_REL)
    assert ref.exact_spread
    assert got.phases[2].objective == pytest.approx(ref.spread, rel=PHASE3_REL)


def test_time_limit_returns_a_feasible_plan_with_its_gap(monkeypatch, caplog) -> None:
    # Uniform 1F1B needs a margin of about the stage count in phase 2 (test_margins.py,
    # test_margin_grows_until_the_bounds_meet); make the time run out the moment it grows: the solve stops there
    # with the best point so far, FEASIBLE, its gap recorded, a warning, and a plan that keeps the caps and the
    # phase-2 makespan bound, and loads.
    from tfplan.plan import plan as plan_mod

    out_of_time = {"now": False}
    grow = Margins.grow

    def grow_and_expire(self, margin):
        out_of_time["now"] = True
        return grow(self, margin)

    monkeypatch.setattr(Margins, "grow", grow_and_expire)
    monkeypatch.setattr(lp.Deadline, "remaining", lambda self: -1.0 if out_of_time["now"] else 1e6)
    dag = dag_mod.build(schedules.generate("1f1b", 6, 60), profile.uniform(6))
    with caplog.at_level(logging.WARNING, logger="tfplan.solve.fastlp"):
        sol = fastlp.solve(dag, 0.9, None, time_limit_s=5.0, first_margin=2, margin=0)
    assert "time limit of 5 s stopped the solve" in caplog.text
    assert sol.status == "FEASIBLE" and sol.time_limit_s == 5.0
    assert [p.status for p in sol.phases] == ["OPTIMAL", "FEASIBLE"]  # phase 1 certified at margin 2, phase 2 not
    assert sol.phases[1].gap > 1e-3
    assert max(lp.cap_excess(dag, sol.ratios, [0.9] * 6)) <= 1e-12
    assert simulate(dag, sol.durations).makespan_ms <= sol.phases[0].objective * (1 + 2e-9)
    plan = plan_mod.make_plan(dag, sol, [0.9] * 6, profile.uniform(6))
    loaded = plan_mod.from_dict(json.loads(json.dumps(plan_mod.to_dict(plan))))
    assert loaded.solver == plan.solver and loaded.solver.status == "FEASIBLE"


def test_time_limit_without_a_feasible_plan_is_a_clear_error() -> None:
    dag = dag_mod.build(schedules.generate("1f1b", 16, 256), _random_profile(16, seed=2))  # 8,192 actions
    with pytest.raises(lp.TimeLimitReached, match=r"^--time-limit: no feasible plan within 0\.001 s"):
        fastlp.solve(dag, 0.9, time_limit_s=0.001)


def test_a_target_just_below_the_optimum_needs_no_full_lp(monkeypatch) -> None:
    # A target in [T1 (1 - 1e-9), T1) is T1 (lp.makespan_bound): no infeasible phase 2, no margins grown to
    # the full LP for it, the same phases as without a target.
    dag = dag_mod.build(schedules.generate("1f1b", 4, 40), _random_profile(4, seed=3, p2p_ms=0.05))
    best = fastlp.solve(dag, 0.9)

    def no_growth(self, margin):
        raise AssertionError("the margin grew")

    monkeypatch.setattr(Margins, "grow", no_growth)
    got = fastlp.solve(dag, 0.9, target_makespan_ms=best.makespan_ms * (1 - 0.5e-9))
    assert got.status == "OPTIMAL"
    assert [p.objective for p in got.phases] == pytest.approx([p.objective for p in best.phases], rel=1e-12)


def test_the_time_limit_keeps_back_the_time_to_make_the_plan(monkeypatch) -> None:
    # The phases stop early enough for the last point's expansion and simulation to end within the limit:
    # their deadline is the limit less two simulations' time (measured on the unfrozen one, here 0.3 s).
    import time as time_mod

    real, deadlines = phases.simulate, []

    def slow(d, durations=None):
        time_mod.sleep(0.3)
        return real(d, durations)

    solve_lp = rounds.solve_lp

    def spy(lp_, tied, deadline, *args, **kwargs):
        deadlines.append(deadline.limit_s)
        return solve_lp(lp_, tied, deadline, *args, **kwargs)

    monkeypatch.setattr(phases, "simulate", slow)
    monkeypatch.setattr(rounds, "solve_lp", spy)
    dag = dag_mod.build(schedules.generate("1f1b", 3, 30), _random_profile(3, seed=4))
    sol = fastlp.solve(dag, 0.9, time_limit_s=100.0)
    assert sol.status == "OPTIMAL" and sol.time_limit_s == 100.0
    assert deadlines and all(99.0 < limit <= 99.4 for limit in deadlines), deadlines

"""The goodput search on fastlp's compressed LP (tfplan.solve.fastlp.goodput): the tied search against the full LP on
every schedule with repeating micro-batches, the certificate against the makespan LP solved at other means, a
margin too small caught by the certificate, and the plan reusing the certified makespan and starting phase 2 from
the search's bases."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.tfplan.solve.fastlp.instances import COMPRESSED, _random_profile
from tfplan.cost.goodput import NoiseModel, progress
from tfplan.errors import TfplanError
from tfplan.plan import job
from tfplan.schedule import schedules
from tfplan.solve import fastlp, solver
from tfplan.solve.fastlp.goodput import CERT_TOL, solve_goodput
from tfplan.step import dag as dag_mod

UNTIED = 10**6  # a margin past every run's length: nothing tied, the full LP


def _noise(num_stages: int, seed: int, model: str = "mccandlish") -> NoiseModel:
    rng = random.Random(seed)
    shares = [rng.uniform(0.2, 1.0) for _ in range(num_stages)]
    updates = [rng.uniform(0.2, 1.0) for _ in range(num_stages)]
    return NoiseModel(noise_scale_tokens=tuple(rng.choice([0.0, rng.uniform(1e3, 4e4)]) for _ in shares),
                      grad_sq_share=tuple(x / sum(shares) for x in shares), microbatch_tokens=512, source="given",
                      learning_model=model, update_share=tuple(x / sum(updates) for x in updates))


def _instance(name: str, p: int, m: int, v: int | None, seed: int, model: str = "mccandlish"):
    sched = schedules.generate(name, p, m, v)
    dag = dag_mod.build(sched, _random_profile(sched.num_stages, seed, p2p_ms=0.05))
    caps = [random.Random(seed).choice([0.5, 0.9, 1.0]) for _ in range(sched.num_stages)]
    return dag, caps, _noise(sched.num_stages, seed, model), float(m * 512)


def _agrees_with_the_full_lp(dag, caps, noise, batch):
    tied = solve_goodput(dag, caps, noise, batch)
    full = solve_goodput(dag, caps, noise, batch, margin=UNTIED)
    assert tied.certified and full.certified and full.compressions == 1
    assert tied.goodput == pytest.approx(full.goodput, rel=1e-7)
    assert tied.goodput <= tied.bound * (1 + 1e-12) and tied.bound <= tied.goodput * (1 + CERT_TOL)
    assert all(0.0 <= x <= c + 1e-9 for x, c in zip(tied.means, caps))
    return tied, full


@pytest.mark.parametrize(("name", "p", "m", "v"), COMPRESSED, ids=[c[0] for c in COMPRESSED])
def test_the_tied_search_finds_the_full_lps_optimum(name, p, m, v):
    dag, caps, noise, batch = _instance(name, p, m, v, seed=sum(map(ord, name)))
    tied, full = _agrees_with_the_full_lp(dag, caps, noise, batch)
    assert tied.lp_columns < full.lp_columns  # the compression was used


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b", "zbv"]), ranks=st.integers(2, 3),
       mbs=st.integers(8, 24), seed=st.integers(0, 10_000))
def test_the_tied_search_agrees_with_the_full_lp_on_random_instances(name, ranks, mbs, seed):
    try:
        dag, caps, noise, batch = _instance(name, ranks, mbs, 2 if name in ("interleaved-1f1b", "zbv") else None,
                                            seed)
    except TfplanError:
        assume(False)
    _agrees_with_the_full_lp(dag, caps, noise, batch)


@pytest.mark.parametrize("model", ["mccandlish", "momentum", "adam"])
def test_the_certificate_bounds_the_goodput_at_any_means(model):
    # Note [goodput certificate]: P(m) / (T*(m) + o) <= bound for every m in the box, T*(m) the makespan LP's
    # optimum at caps m by the reference backend (shares nothing with the certificate but the model), for each
    # learning model's term (tfplan.cost.goodput Note [learning models]).
    dag, caps, noise, batch = _instance("1f1b", 3, 16, None, seed=11, model=model)
    got = solve_goodput(dag, caps, noise, batch)
    rng = np.random.default_rng(0)
    points = [got.means, [0.0] * len(caps), caps] + [list(rng.uniform(0.0, 1.0, len(caps)) * caps) for _ in range(8)]
    for m in points:
        m = [min(c, x) for x, c in zip(m, caps)]
        value = progress(m, batch, noise) / (solver.solve(dag, m).makespan_ms + dag.step_overhead_ms)
        assert value <= got.bound * (1 + 1e-9)
    at_optimum = progress(got.means, batch, noise) / (solver.solve(dag, got.means).makespan_ms + dag.step_overhead_ms)
    assert at_optimum == pytest.approx(got.goodput, rel=1e-8)


@pytest.mark.parametrize("model", ["momentum", "adam"])
def test_the_other_learning_models_find_the_full_lps_optimum(model):
    dag, caps, noise, batch = _instance("interleaved-1f1b", 2, 16, 2, seed=7, model=model)
    _agrees_with_the_full_lp(dag, caps, noise, batch)


def test_a_margin_too_small_is_caught_by_the_certificate():
    # Everything tied (margin 0) restricts the LP below the optimum's shape: the certificate must reject it
    # and the margin grow until the full LP's optimum is found.
    dag = dag_mod.build(schedules.generate("1f1b", 4, 40), _random_profile(4, seed=3))
    noise = NoiseModel(noise_scale_tokens=(4e3, 8e3, 2e4, 1e3), grad_sq_share=(0.1, 0.2, 0.3, 0.4),
                       microbatch_tokens=512, source="given")
    got = solve_goodput(dag, [0.9] * 4, noise, 40 * 512.0, margin=0)
    full = solve_goodput(dag, [0.9] * 4, noise, 40 * 512.0, margin=UNTIED)
    assert got.compressions > 1 and got.certified
    assert got.goodput == pytest.approx(full.goodput, rel=1e-7)


def test_the_plan_reuses_the_certified_makespan():
    # The goodput search certifies phase 1 at its means; the plan's LP (fastlp) starts at phase 2 with it,
    # and the makespan equals phase 1 solved afresh at those caps.
    dag, caps, noise, batch = _instance("1f1b", 3, 40, None, seed=5)
    got = solve_goodput(dag, caps, noise, batch)
    assert got.makespan is not None and got.makespan.status == "OPTIMAL"
    limits = [min(c, x) for c, x in zip(caps, got.means)]
    fresh = fastlp.solve(dag, limits)
    assert got.makespan.objective == pytest.approx(fresh.makespan_ms, rel=1e-9)
    reused = fastlp.solve(dag, limits, makespan=got.makespan)
    assert reused.phases[0] is got.makespan and reused.status == "OPTIMAL"
    for mine, theirs in zip(reused.phases[1:], fresh.phases[1:]):
        assert mine.objective == pytest.approx(theirs.objective, rel=1e-6)
    plan = job.solve_dag(dag, limits, backend="fastlp", anchor=False, makespan=got.makespan)
    assert plan.phases[0] is got.makespan


@pytest.mark.parametrize(("p", "m", "seed"), [(3, 40, 5), (4, 64, 1), (8, 128, 3)])
def test_phase_2_from_the_searchs_bases_finds_the_same_plan_in_fewer_pivots(p, m, seed):
    # Note [goodput handover]: the bases only start GLOP; the phases' values are those solved from scratch.
    dag, caps, noise, batch = _instance("1f1b", p, m, None, seed)
    got = solve_goodput(dag, caps, noise, batch)
    assert got.handover is not None and got.handover.primal is not None and got.handover.dual is not None
    limits = [min(c, x) for c, x in zip(caps, got.means)]
    fresh = fastlp.solve(dag, limits)
    handed = fastlp.solve(dag, limits, makespan=got.makespan, handover=got.handover)
    assert handed.status == "OPTIMAL"
    for mine, theirs in zip(handed.phases, fresh.phases):
        assert mine.objective == pytest.approx(theirs.objective, rel=1e-7)
    assert handed.phases[1].iterations < fresh.phases[1].iterations

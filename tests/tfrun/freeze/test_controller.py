"""tfrun.freeze.controller, the online goodput mode's decisions on fixed inputs: the measured block, the learning gate
and its standard errors, hysteresis, the bound on a move and its continuation, drift re-plans with the reference's
noise, and the explanation each decision carries."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.conftest import ROOT, torch_or_skip


def _noise(*scales: float, shares=(0.5, 0.5)):
    from tfplan.cost.goodput import NoiseModel

    return NoiseModel(noise_scale_tokens=scales, grad_sq_share=shares, microbatch_tokens=64, source="measured")


def _inputs(*scales: float, se=0.1, weight_se=0.1, shares=(0.5, 0.5), measured_se=True):
    from tfrun.freeze.controller import Inputs

    return Inputs(noise=_noise(*scales, shares=shares), noise_log_se=(se,) * len(scales),
                  weight_log_se=(weight_se,) * len(scales), measured_se=measured_se)


@pytest.fixture(scope="module")
def tiny():
    """(the tiny model's measured profile with its noise section, the in-run solve, its goodput plan at cap 0.9)."""
    torch_or_skip()
    from tfplan.cost import profile
    from tfplan.plan import job
    from tfplan.schedule import schedules

    prof = profile.load(ROOT / "profiles" / "tiny-cpu-2stages-mb2.json")
    sched = schedules.generate("1f1b", 2, 8)

    def solve(p, caps, objective):
        return job.solve_schedule(sched, p, 0.9 if caps is None else caps, objective=objective)

    return prof, solve, solve(prof, None, "goodput")


def _reference(noise, se=0.2):
    from tfrun.freeze.controller import Inputs

    return Inputs(noise=noise, noise_log_se=(se, se), weight_log_se=(0.1, 0.1))


def test_the_measured_block_turns_and_leaves_every_tensor_two_microbatches():
    torch_or_skip()
    from tfrun.freeze.controller import measured_block

    for m in (2, 3, 4, 8, 16):
        blocks = [measured_block(k, m) for k in range(m)]
        assert all(len(b) == min(m, max(2, m // 4)) for b in blocks)
        assert set().union(*blocks) == set(range(m))  # every micro-batch measured in turn


def test_the_gate_counts_moves_beyond_their_standard_errors_only():
    torch_or_skip()
    from tfrun.freeze.controller import NOISE_REPLAN, describe, moves

    ref = _inputs(1000.0, 1000.0)
    now = _inputs(1800.0, 1100.0)  # stage 0 x1.8 (ln 0.59), stage 1 x1.1
    # z = 0, the third study's rule: a noise scale beyond NOISE_REPLAN, whatever its error
    assert describe(moves(ref, now, 0.0)) == "noise: stage 0 x1.80 (4.2 SE)"
    assert moves(ref, _inputs(1000.0 * (1 + NOISE_REPLAN) * 0.99, 1000.0), 0.0) == []
    # z = 2: beyond 2 x hypot(0.1, 0.1); with errors of 0.3 the same move is the estimates' own scatter
    assert [(m.stage, m.input, round(m.z, 1)) for m in moves(ref, now, 2.0)] == [(0, "noise_scale", 4.2)]
    assert moves(_inputs(1000.0, 1000.0, se=0.3), _inputs(1800.0, 1100.0, se=0.3), 2.0) == []
    # a stage without a resolved error never moves the plan under the gate
    assert moves(ref, _inputs(1800.0, 1100.0, se=None), 2.0) == []
    # a seed plan's inputs carry no error: the current estimate's counts twice
    seeded = _inputs(1000.0, 1000.0, se=None, measured_se=False)
    assert [round(m.z, 1) for m in moves(seeded, now, 2.0)] == [4.2]


def test_the_weight_shares_are_inputs_too_and_move_alone():
    torch_or_skip()
    from tfrun.freeze.controller import describe, moves

    ref, now = _inputs(1000.0, 1000.0, shares=(0.5, 0.5)), _inputs(1000.0, 1000.0, shares=(0.8, 0.2))
    assert describe(moves(ref, now, 2.0)) == "|G|^2 share: stage 0 x1.60 (3.3 SE), stage 1 x0.40 (6.5 SE)"
    assert moves(ref, now, 0.0) == []  # the third study's rule looked at the noise scales only


def test_measured_inputs_are_the_jackknife_of_each_stage_and_of_the_shares():
    torch = torch_or_skip()
    from tfplan.cost import goodput
    from tfrun.freeze.controller import measured_inputs
    from tfrun.freeze.noise_estimators import TensorNoise

    stages = []
    for s, traces in enumerate(([400.0, 420.0, 380.0, 410.0, 390.0], [300.0, 500.0, 350.0, 450.0, 400.0])):
        noise = TensorNoise("winsor", 2, window=8)
        for k, t in enumerate(traces):
            gsq = torch.tensor([1.0 + 0.1 * k * s, 2.0], dtype=torch.float64)
            noise.add(gsq, torch.tensor([t, 2 * t], dtype=torch.float64), torch.tensor([True, True]))
        stages.append(noise)
    numel = torch.tensor([4.0, 9.0], dtype=torch.float64)
    jack = {s: t.leave_one_out(numel) for s, t in enumerate(stages)}

    def make(scales, shares, updates):
        return goodput.measured(scales, shares, 64, updates)

    got = measured_inputs(jack, 2, make)
    for s, t in enumerate(stages):  # the noise scale's error is TensorNoise.log_spread's
        assert got.noise_log_se[s] == pytest.approx(t.log_spread(), rel=1e-12)
        gsq, trace = t.stage()
        assert got.noise.noise_scale_tokens[s] == pytest.approx(trace / gsq, rel=1e-12)
    assert got.noise.learning_model == "adam" and sum(got.noise.update_share) == pytest.approx(1.0)
    assert got.weight_log_se[0] > 0 and got.weight_log_se[1] > 0  # stage 1's |G|^2 moved: both shares did
    assert measured_inputs({0: jack[0]}, 2, make) is None  # a stage without an estimate: no inputs


def test_the_bound_steps_along_the_segment_and_never_loses_goodput(tiny):
    from tfplan.cost.goodput import with_learning_model
    from tfrun.freeze.controller import MAX_MOVE, bounded_means, goodput_at

    prof, solve, _ = tiny
    assert bounded_means([0.9, 0.0], [0.1, 0.2]) == ([0.65, pytest.approx(0.0625)], True)
    for model in ("adam", "mccandlish"):
        base = with_learning_model(prof.noise, model)
        current = solve(replace(prof, noise=base), None, "goodput")
        noisy = replace(base, noise_scale_tokens=tuple(20 * n for n in base.noise_scale_tokens))
        target = solve(replace(prof, noise=noisy), None, "goodput")
        means, cut = bounded_means(current.mean_ratio_per_stage(), target.mean_ratio_per_stage())
        assert cut and max(abs(a - b) for a, b in zip(means, current.mean_ratio_per_stage())) == \
            pytest.approx(MAX_MOVE)
        step = solve(replace(prof, noise=noisy), means, "makespan")
        at = replace(prof, noise=noisy)
        assert goodput_at(current, at, noisy) < goodput_at(step, at, noisy) <= goodput_at(target, at, noisy) + 1e-9


def test_nothing_moved_nothing_solved(tiny):
    from tfrun.freeze.controller import decide

    prof, _, plan = tiny

    def refuse(*_):
        raise AssertionError("no solve when nothing moved")

    ref = _reference(prof.noise)
    assert decide(plan, ref, ref, {}, 2.0, False, refuse) is None
    within = replace(ref, noise=replace(prof.noise, noise_scale_tokens=(prof.noise.noise_scale_tokens[0] * 1.5,
                                                                         prof.noise.noise_scale_tokens[1])))
    assert decide(plan, ref, within, {}, 2.0, False, refuse) is None  # x1.5 within 2 x hypot(0.2, 0.2)
    # no reference: the estimate now is one, and nothing moved against it; no inputs at all: no goodput solve
    assert decide(plan, None, within, {}, 2.0, False, refuse) is None
    assert decide(plan, None, None, {"1F": 1.5}, 2.0, False, refuse) is None


def test_a_large_move_is_bounded_explained_and_continued(tiny):
    from tfrun.freeze.controller import MARGIN, MAX_MOVE, decide

    prof, solve, plan = tiny
    from tfplan.plan import plan as plan_mod

    ref = _reference(prof.noise)
    now = _reference(replace(prof.noise, noise_scale_tokens=tuple(20 * n for n in prof.noise.noise_scale_tokens)))
    first = decide(plan, ref, now, {}, 2.0, False, solve)
    assert first.reason == "noise: stage 0 x20.00 (10.6 SE), stage 1 x20.00 (10.6 SE)"
    e = first.explain
    assert [(m["stage"], m["input"]) for m in e["moves"]] == [(0, "noise_scale"), (1, "noise_scale")]
    assert e["goodput_before"] * (1 + MARGIN) < e["goodput_target"] and e["bounded"] and first.pending
    assert e["goodput_before"] < e["goodput_after"] < e["goodput_target"]
    moved = plan_mod.from_dict(first.plan_json)
    assert max(abs(a - b) for a, b in zip(moved.mean_ratio_per_stage(), plan.mean_ratio_per_stage())) <= \
        MAX_MOVE + 1e-6
    assert first.reference == now  # the plan is now judged at the new inputs
    # the next check continues the move, with no new evidence needed, until the rest gains less than MARGIN
    plan_now, pending, steps = moved, first.pending, 1
    while pending:
        d = decide(plan_now, now, now, {}, 2.0, True, solve)
        steps += 1
        if d.plan_json is None:
            assert d.explain["decision"].startswith("kept") and not d.pending
            break
        assert d.reason.startswith("continuing") and d.explain["moves"] == []
        plan_now, pending = plan_mod.from_dict(d.plan_json), d.pending
    assert 2 <= steps <= 6


def test_hysteresis_keeps_a_plan_within_the_margin_and_confirms_the_new_inputs(tiny):
    from tfrun.freeze.controller import decide

    prof, solve, plan = tiny
    ref = _reference(prof.noise)
    scales = prof.noise.noise_scale_tokens
    now = _reference(replace(prof.noise, noise_scale_tokens=(scales[0], 2 * scales[1])))  # 2.5 SE
    d = decide(plan, ref, now, {}, 2.0, False, solve)
    assert d.plan_json is None and d.reference == now and not d.pending
    assert d.reason == "noise: stage 1 x2.00 (2.5 SE)" and d.explain["decision"].startswith("kept")
    assert d.explain["goodput_after"] == d.explain["goodput_before"] < d.explain["goodput_target"]


def test_a_drift_solves_with_the_reference_noise_and_keeps_ratios_within_the_margin(tiny):
    from tfplan.plan import plan as plan_mod
    from tfrun.freeze.controller import decide

    prof, solve, plan = tiny
    ref = _reference(prof.noise)
    within = _reference(replace(prof.noise, noise_scale_tokens=tuple(1.2 * n for n in prof.noise.noise_scale_tokens)))
    seen = []

    def spy(p, caps, objective):
        seen.append(p.noise)
        return solve(p, caps, objective)

    d = decide(plan, ref, within, {"1F": 1.05}, 2.0, False, spy)  # a small drift: the best plan barely moves
    assert seen == [ref.noise] and d.reference == ref  # the inputs did not move: the reference's noise
    assert d.reason == "drift: stage 1 F x1.05 (ratios kept)"
    assert d.explain["moves"] == [{"input": "time", "key": "1F", "ratio": 1.05}]
    kept = plan_mod.from_dict(d.plan_json)  # the times follow the machine, the ratios stay
    assert kept.ratios == plan.ratios and kept.predicted.planned_ms > plan.predicted.planned_ms
    assert kept.dag.stage_costs[1].forward_ms == pytest.approx(1.05 * plan.dag.stage_costs[1].forward_ms)


def test_inputs_survive_a_checkpoint_and_an_old_checkpoint_gives_its_noise():
    torch_or_skip()
    from tfrun.freeze.controller import Inputs

    got = _inputs(100.0, 200.0, se=None, weight_se=0.3)
    assert Inputs.from_dict(got.to_dict()) == got
    old = {"noise": _noise(100.0, 200.0).to_dict(), "noise_spread": {"0": 0.25, "1": math.inf}}
    assert Inputs.from_state(old).noise_log_se == (0.25, None) and Inputs.from_state({"noise": None}) is None

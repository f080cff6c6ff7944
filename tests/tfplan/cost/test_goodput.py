"""The goodput model and its LP (tfplan.cost.goodput, tfplan.solve.fastlp.goodput): closed forms, the reduction to the
makespan objective without noise, and the optimum against an independent search over the stage means."""

from __future__ import annotations

import math
import random

import pytest

from tests.conftest import PROFILES
from tfplan.cost import profile
from tfplan.cost.goodput import NoiseModel, efficiency, evaluate, progress, stage_value
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.solve import solver
from tfplan.solve.fastlp.goodput import solve_goodput
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate


def _noise(scales, shares, tokens: int = 512) -> NoiseModel:
    return NoiseModel(noise_scale_tokens=tuple(scales), grad_sq_share=tuple(shares), microbatch_tokens=tokens,
                      source="given")


def test_efficiency_and_progress_closed_forms():
    assert efficiency(4096.0, 4096.0) == 0.5 and efficiency(4096.0, 0.0) == 1.0
    noise = _noise([1000.0, 3000.0], [0.25, 0.75])
    # stage 0 keeps half of 4000 tokens (2000 / 3000), stage 1 all of them (4000 / 7000)
    assert progress([0.5, 0.0], 4000.0, noise) == pytest.approx(0.25 * 2 / 3 + 0.75 * 4 / 7)
    g = evaluate([0.5, 0.0], 400.0, 500.0, 4000.0, noise)
    unfrozen = 0.25 * 0.8 + 0.75 * 4 / 7
    assert g.efficiency == pytest.approx((0.25 * 2 / 3 + 0.75 * 4 / 7) / unfrozen) and g.speedup == 1.25
    assert g.goodput == pytest.approx(g.efficiency * 1.25)


def _dag(name: str, ranks: int, m: int, seed: int):
    rng = random.Random(seed)
    sched = schedules.generate(name, ranks, m)
    stages = []
    for _ in range(sched.num_stages):
        f, b = rng.uniform(5, 15), rng.uniform(10, 30)
        frozen = b * rng.uniform(0.3, 0.7)
        stages.append(profile.StageCost(forward_ms=f, backward_ms=b, backward_frozen_ms=frozen,
                                        backward_input_ms=frozen, backward_weight_ms=b - frozen,
                                        backward_weight_frozen_ms=0.0, tail_ms=rng.uniform(0, 3)))
    prof = profile.Profile(name="random", p2p_ms=rng.uniform(0, 1), step_overhead_ms=rng.uniform(0, 5),
                           stages=tuple(stages))
    return dag_mod.build(sched, prof)


def test_the_learning_models_closed_forms_and_their_sections():
    from tfplan.cost.goodput import from_dict

    base = {"noise_scale_tokens": [1900.0, 3800.0], "grad_sq_share": [0.25, 0.75], "microbatch_tokens": 512,
            "source": "given"}
    old = from_dict(base, 2, None)  # a schema-3 section names no model: the one it was made for
    assert old.learning_model == "mccandlish" and old.to_dict()["learning_model"] == "mccandlish"
    momentum = from_dict(base | {"learning_model": "momentum", "adam_beta1": 0.9}, 2, None)
    # N (1 - 0.9) / (1 + 0.9): 100 and 200 tokens
    assert progress([0.5, 0.0], 4000.0, momentum) == pytest.approx(0.25 * 2000 / 2100 + 0.75 * 4000 / 4200)
    adam = from_dict(base | {"learning_model": "adam", "update_share": [0.4, 0.6]}, 2, None)
    assert progress([0.5, 0.0], 4000.0, adam) == pytest.approx(
        0.4 * (2000 / 3900) ** 0.5 + 0.6 * (4000 / 7800) ** 0.5)
    assert from_dict(adam.to_dict(), 2, None) == adam and from_dict(momentum.to_dict(), 2, None) == momentum
    assert adam.for_stages([2]).update_share == (1.0,)
    for bad, message in (({"learning_model": "sgd"}, "noise.learning_model: must be one of"),
                         ({"learning_model": "adam"}, "noise.update_share: the adam learning model needs it"),
                         ({"learning_model": "momentum", "adam_beta1": 1.0}, "noise.adam_beta1: must be"),
                         ({"update_share": [0.5, 0.6]}, "noise.update_share: must sum to 1")):
        with pytest.raises(Exception, match=message):
            from_dict(base | bad, 2, None)


def test_without_noise_the_optimum_is_the_makespan_plans_speedup():
    d = _dag("1f1b", 2, 4, 0)
    g = solve_goodput(d, [0.8, 0.8], _noise([0.0, 0.0], [0.5, 0.5]), 2048.0)
    makespan = solver.solve(d, [0.8, 0.8])
    fastest = makespan.makespan_ms + d.step_overhead_ms
    assert g.goodput / g.unfrozen_goodput == pytest.approx(simulate(d).batch_time_ms / fastest, rel=1e-9)


def _independent_optimum(d, caps, noise, batch) -> float:
    """max over stage means m <= caps of P(m) / (T*(m) + o), T*(m) the makespan LP's optimum at caps m (the
    reference backend's phase 1): a grid, then Nelder-Mead from its best point. Shares nothing with the
    goodput LP but the model."""
    from scipy.optimize import minimize

    def goodput(m) -> float:
        m = [min(c, max(0.0, x)) for x, c in zip(m, caps)]
        return progress(m, batch, noise) / (solver.solve(d, m).makespan_ms + d.step_overhead_ms)

    grid = [(a * caps[0] / 10, b * caps[1] / 10) for a in range(11) for b in range(11)]
    best = max(grid, key=goodput)
    res = minimize(lambda m: -goodput(m), best, method="Nelder-Mead", bounds=list(zip([0.0, 0.0], caps)),
                   options={"xatol": 1e-9, "fatol": 1e-13, "maxiter": 2000})
    return max(goodput(best), -res.fun)


@pytest.mark.parametrize(("name", "m", "seed", "scales"), [
    ("1f1b", 4, 1, (300.0, 300.0)),
    ("1f1b", 6, 2, (1500.0, 4000.0)),
    ("gpipe", 4, 3, (800.0, 200.0)),
    ("1f1b", 5, 4, (20000.0, 100.0)),
])
def test_the_optimum_equals_an_independent_search_within_1e_6(name, m, seed, scales):
    pytest.importorskip("scipy")
    d = _dag(name, 2, m, seed)
    caps, noise, batch = [0.9, 0.7], _noise(scales, (0.4, 0.6)), 2048.0
    g = solve_goodput(d, caps, noise, batch)
    reference = _independent_optimum(d, caps, noise, batch)
    assert g.goodput == pytest.approx(reference, rel=1e-6)
    assert g.goodput <= g.bound * (1 + 1e-12) and g.bound <= g.goodput * (1 + 1e-7)  # certified
    assert all(0.0 <= x <= c + 1e-12 for x, c in zip(g.means, caps))


def test_a_huge_noise_scale_makes_freezing_not_pay():
    d = _dag("1f1b", 2, 4, 5)
    g = solve_goodput(d, [0.9, 0.9], _noise([1e7, 1e7], [0.5, 0.5]), 2048.0)
    assert not g.pays and g.means == [0.0, 0.0]


def _tiny_noise_profile(tmp_path, scales=(1800.0, 2400.0), saving: float | None = None):
    """The shipped tiny profile with a noise section; `saving`: freezing shortens a backward by only this share."""
    import json

    obj = json.loads((PROFILES / "tiny-cpu-2stages.json").read_text())
    obj["schema_version"] = 3
    for stage in obj["stages"] if saving is not None else []:
        stage["backward_frozen_ms"] = stage["backward_ms"] * (1 - saving)
        stage["backward_weight_frozen_ms"] = stage["backward_weight_ms"] * (1 - saving)
    obj["noise"] = {"noise_scale_tokens": list(scales), "grad_sq_share": [0.3, 0.7], "microbatch_tokens": 512,
                    "source": "given"}
    path = tmp_path / "noise.json"
    path.write_text(json.dumps(obj))
    return path


def test_the_plan_records_its_goodput_and_the_cli_says_when_freezing_does_not_pay(tmp_path):
    import json

    from typer.testing import CliRunner

    from tfplan.cli.app import app
    from tfplan.plan import plan

    prof = _tiny_noise_profile(tmp_path)
    out = tmp_path / "good.json"
    result = CliRunner().invoke(app, ["solve", "-p", str(prof), "-s", "1f1b", "-m", "8", "--objective", "goodput",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    p = plan.load(out)
    assert p.goodput.objective == "goodput" and p.goodput.batch_tokens == 8 * 512
    means = p.mean_ratio_per_stage()
    expected = evaluate(means, p.predicted.planned_ms, p.predicted.no_freeze_ms, 4096.0, p.goodput.noise)
    assert p.goodput.value.goodput == pytest.approx(expected.goodput) and p.goodput.pays
    assert "predicted goodput" in result.output
    edited = json.loads(out.read_text())
    edited["goodput"]["solve"]["bound"] = float("nan")  # printed back by `show --json`: NaN there is not JSON
    (tmp_path / "nan.json").write_text(json.dumps(edited))
    with pytest.raises(TfplanError, match="goodput.solve: must hold finite numbers only"):
        plan.load(tmp_path / "nan.json")
    # the cap-0.9 makespan plan, evaluated with the same noise: lower goodput than the goodput plan
    fast = tmp_path / "fast.json"
    assert CliRunner().invoke(app, ["solve", "-p", str(prof), "-s", "1f1b", "-m", "8", "-o", str(fast)]).exit_code == 0
    shown = json.loads(CliRunner().invoke(app, ["show", str(fast), "--profile", str(prof), "--json"]).output)
    assert shown["goodput"]["objective"] == "makespan" and shown["goodput"]["goodput"] < p.goodput.value.goodput
    # a noise scale far above the batch (progress linear in the kept share) and freezing that saves 2% of a
    # backward: no plan gains as much time as it loses learning. The zero plan, said in one line.
    hopeless = _tiny_noise_profile(tmp_path / "..", scales=(1e9, 1e9), saving=0.02)
    result = CliRunner().invoke(app, ["solve", "-p", str(hopeless), "-s", "1f1b", "-m", "8", "--objective", "goodput"])
    assert result.exit_code == 0 and "freezing does not pay at this batch (4,096 tokens a step" in result.output


def test_the_stage0_anchor_cost_is_recorded_and_printed(tmp_path):
    from typer.testing import CliRunner

    from tfplan.cli.app import app
    from tfplan.plan import job, plan

    for seed in range(40):  # random 1F1B 2 x 4 profiles at cap 0.8 until one where the anchor costs time
        d = _dag("1f1b", 2, 4, seed)
        anchored = job.solve_dag(d, [0.8, 0.8])
        if anchored.anchor_cost_ms > 0:
            break
    else:
        pytest.fail("no random profile where the anchor costs time")
    free = job.solve_dag(d, [0.8, 0.8], anchor=False)
    assert anchored.anchor_cost_ms == pytest.approx(anchored.makespan_ms - free.makespan_ms)
    prof_path = tmp_path / "p.json"
    prof_path.write_text(__import__("json").dumps(profile.Profile(
        name="random", p2p_ms=d.p2p_ms, step_overhead_ms=d.step_overhead_ms, stages=d.stage_costs).to_dict()))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["solve", "-p", str(prof_path), "-s", "1f1b", "-m", "4", "-c", "0.8",
                                      "-o", str(out)], terminal_width=200)
    assert result.exit_code == 0 and f"the stage-0 anchor costs {anchored.anchor_cost_ms:.3f} ms" in result.output
    assert plan.load(out).anchor_cost_ms == pytest.approx(anchored.anchor_cost_ms)


def test_the_time_limit_leaves_the_best_plan_found_uncertified():
    d = _dag("1f1b", 2, 6, 7)
    noise = _noise([300.0, 300.0], [0.5, 0.5])
    out_of_time = solve_goodput(d, [0.9, 0.9], noise, 2048.0, time_limit_s=1e-9)
    assert not out_of_time.certified and out_of_time.means == [0.0, 0.0] and out_of_time.bound == float("inf")
    full = solve_goodput(d, [0.9, 0.9], noise, 2048.0)
    assert full.certified and full.goodput >= out_of_time.goodput


def test_stage_value_stays_finite_at_the_largest_noise_scale() -> None:
    # (kept + N)**2 overflowed at N = 1e308 (a traceback from `tfplan whatif --noise-scale 1e308`).
    e, slope = stage_value((1.0, 1e308, 1.0), 0.5, 8192.0)
    assert e == pytest.approx(4096.0 / 1e308) and math.isfinite(slope) and slope <= 0.0
    e, slope = stage_value((1.0, 1e308, 0.5), 0.5, 8192.0)
    assert math.isfinite(e) and math.isfinite(slope)

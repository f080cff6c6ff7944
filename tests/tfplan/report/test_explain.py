"""`tfplan explain` on synthetic runs: a run directory written from a plan's own simulation with known
perturbations, so every residual and every part of the step's error is known in advance."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfplan.cli.app import app
from tfplan.cost.profile import Profile
from tfplan.errors import TfplanError
from tfplan.plan import plan
from tfplan.report import explain
from tfplan.schedule import schedules
from tfplan.solve import solver
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

TAILS = (0.5, 2.0)
DISPATCH, OVERHEAD, HEAD = 0.1, 1.0, 0.7


def _plan(tmp_path: Path) -> tuple[Path, plan.Plan]:
    from tfplan.cost import profile

    base = profile.uniform(2, forward_ms=3.0, backward_ms=6.0, backward_frozen_ms=3.0)
    prof = Profile(name="synthetic", p2p_ms=0.2, dispatch_ms=DISPATCH, step_overhead_ms=OVERHEAD,
                   stages=tuple(replace(c, tail_ms=t) for c, t in zip(base.stages, TAILS)))
    dag = dag_mod.build(schedules.generate("1f1b", 2, 4), prof)
    p = plan.make_plan(dag, solver.solve(dag, 0.5), [0.5, 0.5], prof)
    path = tmp_path / "plan.json"
    plan.write(p, path)
    return path, plan.load(path)


def _run(tmp_path: Path, plan_path: Path, p: plan.Plan, slower: dict[str, float], waits: float = 0.0,
         tails: tuple[float, float] = TAILS, rest: float = 0.0, name: str = "run") -> Path:
    """A run directory whose actions took the plan's durations plus `slower` (ms), whose hand-overs between
    ranks took `waits` ms longer than the plan's p2p lag, with the given tails and `rest` ms more outside."""
    dag = p.dag
    planned = dag.durations(list(p.ratios))
    dur = [d + slower.get(str(a), 0.0) for a, d in zip(dag.actions, planned)]
    prof = Profile(name="run", p2p_ms=dag.p2p_ms + waits, dispatch_ms=DISPATCH, stages=dag.stage_costs)
    sim = simulate(dag_mod.build(p.schedule, prof), dur)
    start = list(sim.start_ms)
    end = [s + d for s, d in zip(start, dur)]
    run = tmp_path / name
    run.mkdir()
    order = [[str(a) for a in row] for row in p.schedule.order]
    ratios = {str(a): r for a, r in zip(dag.actions, p.ratios) if r > 0}  # as tfrun.cli.setup writes them
    (run / "run_config.json").write_text(json.dumps({"order": order, "plan_path": str(plan_path), "freeze": "plan",
                                                     "ratios": ratios}))
    actions = {str(a): {"rank": dag.rank[v], "start_ms": HEAD + start[v] + DISPATCH,
                        "duration_ms": dur[v] - DISPATCH, "spread": 0.0, "n": 5} for v, a in enumerate(dag.actions)}
    makespan = max(end) - (min(start) + DISPATCH)  # tfrun measures from the first compute start
    last = [max(end[v] for v in range(dag.num_nodes) if dag.rank[v] == r) for r in (0, 1)]
    finish = max(e + t for e, t in zip(last, tails))
    (run / "timings.json").write_text(json.dumps({
        "schema_version": 2, "actions": actions, "makespan_ms": {"3": makespan, "4": makespan},
        "ranks": [{"rank": r, "optimizer_ms": tails[r], "tail_ms": tails[r]} for r in (0, 1)],
    }))
    (run / "summary.json").write_text(json.dumps({"step_time_ms": finish + OVERHEAD + rest}))
    return run


def test_a_run_that_matches_its_plan_has_no_residuals(tmp_path):
    plan_path, p = _plan(tmp_path)
    ex = explain.explain(_run(tmp_path, plan_path, p, {}), None)
    assert ex.measured_step_ms == pytest.approx(ex.predicted_step_ms)
    assert all(a.residual_ms == pytest.approx(0.0, abs=1e-9) for a in ex.actions)
    assert all(v == pytest.approx(0.0, abs=1e-9) for v in ex.error_parts.values())
    assert ex.measured_path == ex.predicted_path
    assert [a.measured_start_ms for a in ex.actions] == pytest.approx([a.predicted_start_ms for a in ex.actions])


def test_the_error_splits_into_actions_waits_tails_and_rest(tmp_path):
    plan_path, p = _plan(tmp_path)
    critical = p.dag.actions[simulate(p.dag, p.dag.durations(list(p.ratios))).critical_path[-1]]
    # Each part is given its own known amount. actions: 0F0 is on every path of a 1F1B step (every other action
    # waits for it) and the critical path's last action ends the step, so 0.5 + 2.0 ms longer actions make
    # the replayed step exactly 2.5 ms longer. tails: rank 0 ends last (its last backward follows rank 1's),
    # so 3.0 ms more of its tail is 3.0 ms more step. rest: 0.25 ms more outside. waits: every cross-rank
    # hand-over 1.5 ms slower than the plan's p2p lag, which a DAG with that lag shows.
    run = _run(tmp_path, plan_path, p, {str(critical): 2.0, "0F0": 0.5}, waits=1.5, tails=(3.5, TAILS[1]), rest=0.25)
    ex = explain.explain(run, None)
    assert ex.error_parts["actions"] == pytest.approx(2.5)
    assert ex.error_parts["tails"] == pytest.approx(3.0)
    assert ex.error_parts["rest"] == pytest.approx(0.25)
    dur = [d + {str(critical): 2.0, "0F0": 0.5}.get(str(a), 0.0)
           for a, d in zip(p.dag.actions, p.dag.durations(list(p.ratios)))]
    slow_lag = Profile(name="l", p2p_ms=p.dag.p2p_ms + 1.5, dispatch_ms=DISPATCH, stages=p.dag.stage_costs)
    waited = simulate(dag_mod.build(p.schedule, slow_lag), dur).actions_end_ms - simulate(p.dag, dur).actions_end_ms
    assert waited > 0 and ex.error_parts["waits"] == pytest.approx(waited)
    by_key = {key: residual for key, _, _, _, residual in ex.by_stage_kind()}
    assert by_key[f"{critical.stage}{critical.kind}"] == pytest.approx(2.0)
    assert by_key["0F"] == pytest.approx(0.5)
    assert ex.largest(1)[0].action == str(critical)


def test_json_and_trace_from_the_command_line(tmp_path):
    plan_path, p = _plan(tmp_path)
    run = _run(tmp_path, plan_path, p, {"1B2": 1.0})
    trace = tmp_path / "trace.json"
    result = CliRunner().invoke(app, ["explain", str(run), "--json", "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["largest"][0]["action"] == "1B2"
    late = _run(tmp_path, plan_path, p, {}, rest=2.0, name="late")  # 2 ms more outside the actions, nothing else
    data = json.loads(CliRunner().invoke(app, ["explain", str(late), "--json"]).output)
    assert data["error"] == pytest.approx(2.0 / p.predicted.planned_ms)
    assert data["predicted_step_ms"] == pytest.approx(p.predicted.planned_ms)
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
    assert len([e for e in events if e["ph"] == "X"]) == 2 * p.dag.num_nodes
    human = CliRunner().invoke(app, ["explain", str(run)])
    assert human.exit_code == 0 and "largest residuals" in human.output and "measured timeline" in human.output


def test_uniform_runs_are_predicted_from_their_own_ratios_and_timely_runs_refused(tmp_path):
    plan_path, p = _plan(tmp_path)
    run = _run(tmp_path, plan_path, p, {})
    config = json.loads((run / "run_config.json").read_text())
    mean = p.predicted.mean_freeze_ratio
    config |= {"freeze": "uniform", "ratios": {str(a): mean for v, a in enumerate(p.dag.actions)
                                               if p.dag.freeze_mask()[v]}}
    (run / "run_config.json").write_text(json.dumps(config))
    ex = explain.explain(run, None)
    assert ex.predicted_step_ms == pytest.approx(p.predicted.uniform_ms)
    (run / "run_config.json").write_text(json.dumps(config | {"freeze": "timely"}))
    result = CliRunner().invoke(app, ["explain", str(run)])
    assert result.exit_code == 1 and "no fixed ratios" in result.output


def test_bad_run_directories_are_one_line_errors(tmp_path):
    plan_path, p = _plan(tmp_path)
    with pytest.raises(TfplanError, match="run_config.json not found"):
        explain.explain(tmp_path / "nowhere", None)
    run = _run(tmp_path, plan_path, p, {})
    other = tmp_path / "other.json"
    d = dag_mod.build(schedules.generate("gpipe", 2, 4), Profile(name="x", stages=p.dag.stage_costs))
    plan.write(plan.make_plan(d, solver.solve(d, 0.5), [0.5, 0.5], Profile(name="x", stages=p.dag.stage_costs)),
               other)
    with pytest.raises(TfplanError, match="another schedule"):
        explain.explain(run, other)
    timings = json.loads((run / "timings.json").read_text())
    del timings["actions"]["1B3"]
    (run / "timings.json").write_text(json.dumps(timings))
    with pytest.raises(TfplanError, match="no timing for 1 actions"):
        explain.explain(run, None)
    (run / "timings.json").write_text(json.dumps({"by_action_ms": {}}))
    result = CliRunner().invoke(app, ["explain", str(run)])
    assert result.exit_code == 1 and "older tfrun" in result.output


@pytest.mark.parametrize(("name", "edit", "field"), [
    ("timings.json", lambda t, c: t["actions"]["1B3"].update(duration_ms=float("nan")), "actions"),
    ("timings.json", lambda t, c: t["actions"]["0F0"].update(start_ms=-1.0), "actions"),
    ("timings.json", lambda t, c: t["makespan_ms"].update({"3": float("inf")}), "makespan_ms"),
    ("run_config.json", lambda t, c: c.update(ratios={"1B3": 5.0}), "ratios"),
    ("timings.json", lambda t, c: t.update(ranks=[{"rank": True, "tail_ms": 0.0}]), "ranks"),
])
def test_run_files_with_numbers_that_are_no_times_are_one_line_errors(tmp_path, name, edit, field):
    # NaN and infinities in a run's files once reached the report's columns (a ValueError traceback).
    plan_path, p = _plan(tmp_path)
    run = _run(tmp_path, plan_path, p, {})
    timings, config = (json.loads((run / f).read_text()) for f in ("timings.json", "run_config.json"))
    edit(timings, config)
    (run / "timings.json").write_text(json.dumps(timings))
    (run / "run_config.json").write_text(json.dumps(config))
    with pytest.raises(TfplanError, match=f"{name}: {field}: must be"):
        explain.explain(run, None)


def _with_step_durations(run: Path, p: plan.Plan, rows: dict[str, list[float]]) -> None:
    """Add per-step durations (ms, in the DAG's action order, without dispatch) to a run's timings.json."""
    timings = json.loads((run / "timings.json").read_text())
    order = [str(a) for a in p.dag.actions]
    names = sorted(order)
    timings["step_durations"] = {"actions": names,
                                 "ms": {step: [row[order.index(a)] for a in names] for step, row in rows.items()}}
    (run / "timings.json").write_text(json.dumps(timings))


def test_waits_split_into_variability_and_idle_from_per_step_durations(tmp_path):
    plan_path, p = _plan(tmp_path)
    run = _run(tmp_path, plan_path, p, {}, waits=1.5)
    dag = p.dag
    base = [d - DISPATCH for d in dag.durations(list(p.ratios))]
    # Rank 0 is 2 ms slower per action in one step, rank 1 in another: every action's median is its base
    # time, but two of the three steps are longer, so the median step is longer than the replay of medians.
    slow = {r: [d + (2.0 if dag.rank[v] == r else 0.0) for v, d in enumerate(base)] for r in (0, 1)}
    _with_step_durations(run, p, {"3": base, "4": slow[0], "5": slow[1]})
    ex = explain.explain(run, None)

    def replay(row: list[float]) -> float:
        return simulate(dag, [d + DISPATCH for d in row]).actions_end_ms

    expected = sorted(replay(row) for row in (base, slow[0], slow[1]))[1] - replay(base)
    assert expected > 0
    assert ex.waits_split["variability"] == pytest.approx(expected)

    _with_step_durations(run, p, {"3": base, "4": base})  # steps alike: the waiting is the slower hand-overs
    ex = explain.explain(run, None)
    slow_lag = Profile(name="l", p2p_ms=dag.p2p_ms + 1.5, dispatch_ms=DISPATCH, stages=dag.stage_costs)
    planned = dag.durations(list(p.ratios))
    waited = (simulate(dag_mod.build(p.schedule, slow_lag), planned).actions_end_ms
              - simulate(dag, planned).actions_end_ms)
    assert waited > 0
    assert ex.waits_split["variability"] == pytest.approx(0.0, abs=1e-9)
    assert ex.waits_split["idle"] == pytest.approx(waited)
    result = CliRunner().invoke(app, ["explain", str(run), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["waits_split_ms"]["idle"] == pytest.approx(
        ex.waits_split["idle"])
    assert "variability" in CliRunner().invoke(app, ["explain", str(run)]).output


def test_runs_without_per_step_durations_or_with_bad_ones(tmp_path):
    plan_path, p = _plan(tmp_path)
    run = _run(tmp_path, plan_path, p, {})
    assert explain.explain(run, None).waits_split is None  # an older run: waits stay whole
    timings = json.loads((run / "timings.json").read_text())
    timings["step_durations"] = {"actions": ["0F0"], "ms": {"3": [1.0, 2.0]}}
    (run / "timings.json").write_text(json.dumps(timings))
    result = CliRunner().invoke(app, ["explain", str(run)])
    assert result.exit_code == 1 and "step_durations" in result.output and len(result.output.splitlines()) == 1


def test_forward_speed_takes_the_machines_drift_out_of_the_error(tmp_path):
    plan_path, p = _plan(tmp_path)
    matched = explain.explain(_run(tmp_path, plan_path, p, {}), None)
    assert matched.forward_speed == pytest.approx(1.0) and matched.speed_adjusted_error == pytest.approx(0.0)
    planned = p.dag.durations(list(p.ratios))
    # A machine 10% slower at everything (actions, hand-overs, tails and the rest of the step): the step is
    # exactly 1.1x the prediction, the forwards say 1.1, and at that speed nothing is left of the error.
    slower = {str(a): 0.1 * d for a, d in zip(p.dag.actions, planned)}
    ex = explain.explain(_run(tmp_path, plan_path, p, slower, waits=0.1 * p.dag.p2p_ms,
                              tails=tuple(1.1 * t for t in TAILS), rest=0.1 * OVERHEAD, name="slower"), None)
    assert ex.forward_speed == pytest.approx(1.1) and ex.error == pytest.approx(0.1)
    assert ex.speed_adjusted_error == pytest.approx(0.0, abs=1e-12)
    # Only the actions slower: the rest of the step did not drift, so the at-speed error is negative.
    actions_only = explain.explain(_run(tmp_path, plan_path, p, slower, name="actions-only"), None)
    assert actions_only.forward_speed == pytest.approx(1.1) and 0 < actions_only.error < 0.1
    assert actions_only.speed_adjusted_error < 0
    data = ex.to_dict()
    assert data["forward_speed"] == pytest.approx(1.1) and data["speed_adjusted_error"] == pytest.approx(0.0, abs=1e-12)


def test_the_speed_per_kind_takes_out_a_drift_the_forwards_alone_misjudge(tmp_path):
    """Note [speed per kind]: the forwards x1.2 slower than profiled, the backwards as profiled and the tails x0.8
    (interleaved zero-bubble's drift, docs/benchmarks.md): the forwards' speed scales the whole step and
    over-predicts it; the speed per kind replays the step exactly."""
    plan_path, p = _plan(tmp_path)
    planned = p.dag.durations(list(p.ratios))
    forwards = {str(a): 0.2 * d for a, d in zip(p.dag.actions, planned) if a.kind == "F"}
    tails = tuple(0.8 * t for t in TAILS)
    ex = explain.explain(_run(tmp_path, plan_path, p, forwards, tails=tails, name="forwards"), None)
    assert ex.kind_speed["F"] == pytest.approx(1.2) and ex.kind_speed["B"] == pytest.approx(1.0)
    assert ex.kind_speed["tail"] == pytest.approx(0.8)
    assert ex.speed_error == pytest.approx(0.0, abs=1e-12) and ex.speed_step_ms == pytest.approx(ex.measured_step_ms)
    assert ex.forward_speed == pytest.approx(1.2) and ex.speed_adjusted_error < -0.05
    kinds = {k: (n, pr, m) for k, n, pr, m in ex.by_kind()}
    assert kinds["F"][0] == 8 and kinds["F"][2] == pytest.approx(1.2 * kinds["F"][1])
    # At the profile's own speed every factor is 1 and the prediction is the plan's.
    matched = explain.explain(_run(tmp_path, plan_path, p, {}), None)
    assert all(v == pytest.approx(1.0) for v in matched.kind_speed.values())
    assert matched.speed_step_ms == pytest.approx(matched.predicted_step_ms)
    data = json.loads(CliRunner().invoke(app, ["explain", str(tmp_path / "forwards"), "--json"]).output)
    assert data["speed_error"] == pytest.approx(0.0, abs=1e-12) and data["kind_speed"]["F"] == pytest.approx(1.2)
    assert [row["kind"] for row in data["by_kind"]] == ["F", "B"]
    text = CliRunner().invoke(app, ["explain", str(tmp_path / "forwards")]).output
    assert "at the run's speed per kind (F x1.20, B x1.00, tail x0.80" in text and "time per action kind" in text


def test_a_plan_with_a_noise_section_reports_its_learning_model_at_the_runs_realised_ratios(tmp_path):
    """The plan's learning model (tfplan.cost.goodput) read by explain: the efficiency the plan predicted at its
    means, and the same model's at the ratios the run realised (summary.json), in closed form for mccandlish."""
    from tfplan.cost.goodput import NoiseModel

    path, p = _plan(tmp_path)
    noise = NoiseModel(noise_scale_tokens=(1000.0, 3000.0), grad_sq_share=(0.25, 0.75), microbatch_tokens=64,
                       source="given", learning_model="mccandlish")
    batch = 4 * 64.0
    prof = Profile(name="synthetic", p2p_ms=0.2, dispatch_ms=DISPATCH, step_overhead_ms=OVERHEAD,
                   stages=p.dag.stage_costs)
    noisy = plan.make_plan(p.dag, solver.solve(p.dag, 0.5), [0.5, 0.5], prof, goodput=("makespan", noise, batch, None))
    plan_path = tmp_path / "noisy.json"
    plan.write(noisy, plan_path)
    run = _run(tmp_path, plan_path, plan.load(plan_path), {}, name="noisy")
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"realised_freeze_ratio": [0.4, 0.3]}))
    ex = explain.explain(run, None)

    def e(ratios):
        return sum(w * (1 - r) * batch / ((1 - r) * batch + n) for w, n, r in zip((0.25, 0.75), (1000.0, 3000.0),
                                                                                   ratios))

    assert ex.learning["learning_model"] == "mccandlish"
    means = noisy.mean_ratio_per_stage()
    assert ex.learning["planned_efficiency"] == pytest.approx(e(means) / e([0, 0]))
    assert ex.learning["realised_efficiency"] == pytest.approx(e([0.4, 0.3]) / e([0, 0]))
    text = CliRunner().invoke(app, ["explain", str(run)]).output
    assert "learning (mccandlish model, 256 tokens a step)" in text and "realised ratios 0.40, 0.30" in text
    assert explain.explain(_run(tmp_path, path, p, {}, name="plain"), None).learning is None

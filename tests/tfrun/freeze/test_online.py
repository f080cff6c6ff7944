"""Online TimelyFreeze (`tfrun train --freeze timely`): phases, the probe, drift and re-planning, end to end on
2 gloo ranks (tiny model, short sequences)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

FAST = ["--microbatch-size", "2", "--seq-len", "32", "--quiet", "--eval-batches", "1"]  # no test reads an eval loss
SHORT = ["--warmup-steps", "2", "--monitor-steps", "4", "--probe-steps", "2", "--ramp-steps", "3"]


def _timely(out: Path, *args: str) -> list[str]:
    """The arguments of `tfrun train --freeze timely` on 2 ranks x 4 micro-batches."""
    return ["tfrun", "train", "--freeze", "timely", "--ranks", "2", "--microbatches", "4", "--out", str(out), *FAST,
            *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """Every online run of the slow tests below, in this order, on one pair of rank processes (tests/shared_ranks.py:
    tfrun's CLI, launcher and worker, with the process start-up paid once; what a run does is what a separate
    launch does, bit for bit). Returns (folder, result by name); after "resume-10", its plan.json is copied to
    plan-after-10.json."""
    torch_or_skip()
    from tests import shared_ranks

    root = tmp_path_factory.mktemp("online")
    seed = _goodput_seed(root)
    resume = ["--schedule", "1f1b", *SHORT]
    r = root / "r"
    commands = {
        "timely": (_timely(root / "timely", "--schedule", "1f1b", "--steps", "22", "--replan-window", "5", *SHORT,
                           "--checkpoint-every", "22"), {}),
        # At these test sizes (2 x 32 tokens) actions take a few ms and their times move by x2 under load, so
        # the threshold is x4; the injection makes stage 1's forward about x10 (its mechanism is what is tested).
        **{name: (_timely(root / name, "--schedule", "1f1b", "--steps", "24", "--replan-window", "5",
                          "--replan-threshold", "3.0", *SHORT), env)
           for name, env in (("steady", {}), ("slowed", {"TFRUN_SLOW": "1:14:60"}))},  # stage 1 F +60 ms from 14
        # the online goodput mode (its controller's default gate): noise measured every step, a window of 4,
        # checks every 4
        "gated": (_timely(root / "gated", "--schedule", "1f1b", "--steps", "20", "--objective", "goodput",
                          "--replan-window", "4", "--noise-every", "1", "--noise-window", "4", *SHORT), {}),
        # seeded by a goodput plan (no probe: deterministic), action times not judged: uninterrupted, and
        # stopped at 10 then resumed to 16
        "goodput-whole": (_seeded(root / "goodput-whole", seed, "16"), {}),
        "goodput-part": (_seeded(root / "goodput-part", seed, "10"), {}),
        "goodput-resumed": (_seeded(root / "goodput-part", seed, "16", "--resume", str(root / "goodput-part")), {}),
        # the same seed measured at every step but never re-planning, and that seed as a fixed plan: with shadow
        # gradients the measured blocks change no update (tfrun.freeze.noise Note [shadow gradients])
        "goodput-measuring": (_seeded(root / "goodput-measuring", seed, "8", "--warmup-steps", "0",
                                      "--noise-replan-z", "1e9"), {}),
        "goodput-fixed": (["tfrun", "train", "--freeze", "plan", "--plan", str(seed), "--force", "--out",
                           str(root / "goodput-fixed"), *FAST, "--steps", "8"], {}),
        "zb": (_timely(root / "zb", "--schedule", "interleaved-zb", "--stages-per-rank", "2", "--steps", "14",
                       *SHORT), {}),
        "resume-7": (_timely(r, "--steps", "7", *resume, "--checkpoint-every", "1"), {}),  # stops in the probe (6-7)
        "resume-10": (_timely(r, "--steps", "10", *resume, "--resume", str(r)), {},  # solves at 7, stops in the ramp
                      [(r / "plan.json", root / "plan-after-10.json")]),
        "resume-14": (_timely(r, "--steps", "14", *resume, "--resume", str(r)), {}),
    }
    results = shared_ranks.run(list(commands.values()), 2, root / "harness")
    return root, dict(zip(commands, results))


def _seeded(out: Path, seed: Path, steps: str, *args: str) -> list[str]:
    """`tfrun train --freeze timely --objective goodput` seeded by `seed`, with the action times not judged (drift
    re-plans depend on the machine's timing) and the noise measured every step, checked every 4 steps."""
    return ["tfrun", "train", "--freeze", "timely", "--plan", str(seed), "--force", "--out", str(out), *FAST,
            "--steps", steps, "--objective", "goodput", "--replan-window", "4", "--replan-threshold", "1e9",
            "--noise-every", "1", "--noise-window", "4", "--warmup-steps", "2", "--checkpoint-every", "10", *args]


def _goodput_seed(root: Path) -> Path:
    """A plan solved for goodput (tfplan solve --objective goodput) for 2 ranks x 4 micro-batches of 2 x 32 tokens, from
    uniform stage times and a noise section that makes freezing pay."""
    from dataclasses import replace

    from tfplan.cost import goodput, profile
    from tfplan.plan import job, plan
    from tfplan.schedule import schedules

    noise = goodput.measured([20.0, 20.0], [0.5, 0.5], 64, [0.5, 0.5])
    prof = replace(profile.uniform(2), noise=noise)
    path = root / "goodput-seed.json"
    plan.write(job.solve_schedule(schedules.generate("1f1b", 2, 4), prof, 0.9, objective="goodput"), path)
    return path


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_probe_freezes_whole_microbatches_and_covers_them_all():
    from tfrun.freeze.candidates import Candidate
    from tfrun.freeze.freezing import Freezer

    f = Freezer({0: [Candidate(name="a", cost=1.0), Candidate(name="b", cost=3.0)]}, {}, num_microbatches=8, seed=0)
    f.set_probe(10, 2)
    frozen = [f.probe_microbatches(s) for s in range(10, 14)]
    assert all(len(mbs) == 2 for mbs in frozen) and set().union(*frozen) == set(range(8))
    assert f.selection(10, 0, min(frozen[0])).share == 1.0
    assert f.selection(10, 0, max(set(range(8)) - frozen[0])).names == frozenset()
    f.set_plan({(0, 1): 0.5}, 14, 0)  # a plan ends the probe
    assert f.probe is None and f.selection(14, 0, 0).names == frozenset()


def test_a_seed_plan_is_applied_after_the_warmup_even_without_a_ramp(tmp_path):
    torch = torch_or_skip()
    import torch.distributed as dist

    from tfplan.cost import profile
    from tfplan.plan import plan
    from tfplan.schedule import schedules
    from tfplan.solve import solver
    from tfplan.step import dag
    from tfrun.config.train_config import TrainConfig
    from tfrun.freeze.candidates import Candidate
    from tfrun.freeze.freezing import Freezer
    from tfrun.freeze.online import OnlinePlanner
    from tfrun.measure.timing import ActionTimer

    prof = profile.uniform(2)
    d = dag.build(schedules.generate("1f1b", 2, 4), prof)
    seed = tmp_path / "seed.json"
    plan.write(plan.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], prof), seed)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        for warmup in (0, 2):
            config = TrainConfig(order=[[str(a) for a in r] for r in d.schedule.order], num_stages=2,
                                 num_microbatches=4, stage_to_rank=[0, 1], freeze="timely", plan_path=str(seed),
                                 warmup_steps=warmup, ramp_steps=0)
            freezer = Freezer({s: [Candidate(name="w", cost=1.0)] for s in (0, 1)}, {}, num_microbatches=4, seed=0)
            online = OnlinePlanner(config, freezer, ActionTimer(0, torch.device("cpu")), tmp_path / f"o{warmup}",
                                   {0: 1, 1: 1})
            for step in range(warmup + 1):
                events = online.before_step(step)
            assert [e["reason"] for e in events if e["event"] == "plan"] == ["seed plan"]
            assert freezer.ratios and freezer.epoch == warmup
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_timely_runs_every_phase_and_plans_identically_on_every_rank(runs):
    torch = torch_or_skip()
    out, proc = runs[0] / "timely", runs[1]["timely"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "online TimelyFreeze: warmup 0-1, monitor 2-5, probe 6-7, ramp 8-10, stable from 11" in proc.stdout
    rows = _rows(out)
    events = [r for r in rows if "event" in r]
    assert [(e["phase"], e["step"]) for e in events if e["event"] == "phase"] == [
        ("warmup", 0), ("monitor", 2), ("probe", 6), ("ramp", 8), ("stable", 11)]
    assert [(e["event"], e["step"]) for e in events if e["event"] in ("probe", "plan")][:2] == [("probe", 7),
                                                                                                 ("plan", 8)]
    assert all("time" in r for r in rows) and [r["phase"] for r in rows if "loss" in r][:3] == ["warmup"] * 2 + [
        "monitor"]
    summary = json.loads((out / "summary.json").read_text())
    assert [p["name"] for p in summary["phases"]] == ["warmup", "monitor", "probe", "ramp", "stable"]
    # The figures, recomputed from the run's own rows: the solve after step 7 is in that step's wall time (the
    # ranks wait for rank 0's solve in a broadcast), the shares are of wall time, and the headline is the first
    # plan against the stable steps it was in force for (until a re-plan, if this machine's load caused one).
    steps = [r for r in rows if "loss" in r]
    assert steps[7]["wall_ms"] >= steps[7]["step_time_ms"] + summary["solve_s"][0] * 1e3
    total = sum(r["wall_ms"] for r in steps)
    assert summary["train_wall_s"] == pytest.approx(total / 1e3)
    assert summary["outside_stable_share"] == pytest.approx(sum(r["wall_ms"] for r in steps[:11]) / total)
    plans = [e for e in events if e["event"] == "plan"]
    end = plans[1]["step"] if len(plans) > 1 else 22
    first_ms = statistics.median(r["step_time_ms"] for r in steps[11:end])
    assert summary["step_time_ms"] == pytest.approx(statistics.median(r["step_time_ms"] for r in steps[11:]))
    assert summary["predicted_step_ms"] == plans[0]["new_predicted_ms"]
    assert summary["prediction_error"] == pytest.approx((first_ms - plans[0]["new_predicted_ms"]) /
                                                        plans[0]["new_predicted_ms"])
    result = subprocess.run([sys.executable, "-m", "tfplan", "show", str(out / "plan.json")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (out / "plans" / "step0000008.json").exists()
    plans = [torch.load(out / "checkpoints" / "step0000022" / f"rank{r}.pt", weights_only=False)["online"]["plan"]
             for r in (0, 1)]
    assert plans[0] == plans[1] == json.loads((out / "plan.json").read_text())
    assert any(r["freeze_ratio"][1] > 0 for r in rows if "loss" in r and r["phase"] == "stable")


@pytest.mark.slow
def test_a_stage_that_slows_down_triggers_a_replan_and_a_steady_one_does_not(runs):
    root, results = runs
    plans = {}
    for name in ("steady", "slowed"):  # slowed: stage 1's forward 60 ms longer from step 14 (TFRUN_SLOW)
        proc = results[name]
        assert proc.returncode == 0, proc.stderr[-3000:]
        plans[name] = [r for r in _rows(root / name) if r.get("event") == "plan"]
    assert [p["reason"] for p in plans["steady"]] == ["first plan"]
    replans = plans["slowed"][1:]
    assert replans and replans[0]["reason"].startswith("drift: stage 1 F")
    assert replans[0]["new_predicted_ms"] > replans[0]["old_predicted_ms"]


@pytest.mark.slow
def test_the_online_goodput_mode_explains_its_plans_and_measures_on_unfrozen_microbatches(runs):
    root, results = runs
    proc = results["gated"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "if a new plan gains more than 1%" in proc.stdout  # the controller's settings, said at the start
    rows = _rows(root / "gated")
    plans = [r for r in rows if r.get("event") == "plan"]
    assert plans[0]["reason"] == "first plan" and plans[0]["goodput_before"] == 1.0
    assert plans[0]["goodput_after"] == plans[0]["goodput_target"] > 0
    # every plan records the inputs it was solved with and their standard errors (a window of 4 measured steps)
    assert all(len(p["noise_log_se"]) == 2 and len(p["weight_log_se"]) == 2 for p in plans)
    assert all(se is not None and se >= 0 for se in plans[0]["noise_log_se"])
    for event in (r for r in rows if r.get("event") in ("plan", "check") and r["reason"] != "first plan"):
        assert {"moves", "goodput_before", "goodput_after", "goodput_target"} <= set(event)
    # Note [unfrozen measurement]: every step is measured here, and from the first plan on each leaves a turning
    # block of 2 of the 4 micro-batches unfrozen on both stages
    sets = [json.loads(line) for line in (root / "gated" / "frozen_sets.jsonl").read_text().splitlines()[1:]]
    for k, row in enumerate(r for r in sets if r["step"] >= plans[0]["step"]):
        block = {(8 + k) * 2 % 4, ((8 + k) * 2 + 1) % 4}  # (8 measured steps before the first plan's)
        assert all(row["frozen"][s][mb] == [] for s in (0, 1) for mb in block)
    # (the gate's decisions themselves are checked on fixed inputs in test_controller.py)


@pytest.mark.slow
def test_a_resumed_goodput_run_equals_the_uninterrupted_one(runs):
    root, results = runs
    for name in ("goodput-whole", "goodput-part", "goodput-resumed"):
        assert results[name].returncode == 0, results[name].stderr[-3000:]

    def story(folder: str) -> list:  # (clocks aside, and the evaluation the first part made at its last step)
        drop = ("time", "solve_s", "step_time_ms", "tokens_per_s", "wall_ms", "eval_ms", "eval_loss",
                "eval_microbatch_losses")
        return [{k: v for k, v in r.items() if k not in drop} for r in _rows(root / folder)]

    whole, resumed = story("goodput-whole"), story("goodput-part")
    assert resumed == whole  # losses, noise estimates, ratios, every plan and check event, bit for bit
    events = [e for e in whole if e.get("event") in ("plan", "check")]
    assert events[0]["reason"] == "seed plan" and events[0]["step"] == 2  # no probe, no ramp
    for e in events[1:]:  # a learning input moved beyond 2 standard errors, or a cut-short move went on
        assert e["reason"].startswith("continuing") or any(m["z"] > 2 for m in e["moves"]), e
    sets = [(root / f / "frozen_sets.jsonl").read_text() for f in ("goodput-whole", "goodput-part")]
    assert sets[0] == sets[1]


@pytest.mark.slow
def test_measured_steps_train_what_the_plan_trains(runs):
    root, results = runs
    for name in ("goodput-measuring", "goodput-fixed"):
        assert results[name].returncode == 0, results[name].stderr[-3000:]
    measuring, fixed = ([r for r in _rows(root / f) if "event" not in r]
                        for f in ("goodput-measuring", "goodput-fixed"))
    assert all("noise_scale_tokens" in r for r in measuring)  # every step measured (and leaves a block unfrozen ...)
    sets = [json.loads(line)
            for line in (root / "goodput-measuring" / "frozen_sets.jsonl").read_text().splitlines()[1:]]
    assert all(any(row["frozen"][s][mb] == [] for mb in range(4)) for row in sets for s in (0, 1))
    assert [r["loss"] for r in measuring] == [r["loss"] for r in fixed]  # ... and learns what the plan does


@pytest.mark.slow
def test_timely_on_a_zero_bubble_schedule(runs):
    out, proc = runs[0] / "zb", runs[1]["zb"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    from tfplan.plan import plan as plan_mod

    plan = plan_mod.load(out / "plan.json")
    assert plan.schedule.name == "interleaved-zb"
    assert any(r > 0 for action, r in plan.ratio_of().items() if "W" in action)


@pytest.mark.slow
def test_resumed_in_the_probe_and_in_the_ramp_the_run_keeps_its_measurements_and_plan(runs):
    root, results = runs
    out = root / "r"  # 7 steps (checkpoints every step), resumed to 10 steps, resumed to 14
    assert results["resume-7"].returncode == 0, results["resume-7"].stderr[-3000:]
    assert results["resume-10"].returncode == 0, results["resume-10"].stderr[-3000:]
    first_plan = (root / "plan-after-10.json").read_text()
    proc = results["resume-14"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    assert [r["step"] for r in rows if "loss" in r] == list(range(14))
    assert [(e["event"], e.get("phase"), e["step"]) for e in rows if "event" in e] == [
        ("phase", "warmup", 0), ("phase", "monitor", 2), ("phase", "probe", 6), ("probe", None, 7),
        ("plan", None, 8), ("phase", "ramp", 8), ("phase", "stable", 11)]
    assert (out / "plan.json").read_text() == first_plan  # the same plan after the second resume

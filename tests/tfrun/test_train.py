"""`tfrun train` end to end on 2 gloo ranks (tiny model, short sequences): outputs, bad input, joining an
external torchrun, the measured profile feeding `tfplan solve`, and reliability (issue 13): a SIGTERM stops
with a checkpoint and the resume continues the same losses bit for bit; a rank SIGKILLed mid-step ends the
job quickly, naming it; a truncated newest checkpoint makes the resume fall back to the previous one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

FAST = ["--microbatch-size", "2", "--seq-len", "32", "--quiet"]
# The reliability runs use the recipe's schedule, clipping and weight decay (issue 37): a resume continues the same
# loss, lr and grad_norm sequence bit for bit.
RECIPE = ["--lr-schedule", "cosine", "--lr-warmup-steps", "2", "--clip-grad-norm", "1.0", "--weight-decay", "0.01"]


def _plan(tmp_path: Path, schedule: str = "1f1b", ranks: int = 2, m: int = 4, cap: float = 0.9) -> Path:
    from tfplan.cost import profile
    from tfplan.plan import plan
    from tfplan.schedule import schedules
    from tfplan.solve import solver
    from tfplan.step import dag

    sched = schedules.generate(schedule, ranks, m)
    prof = profile.uniform(sched.num_stages, name="unit")
    d = dag.build(sched, prof)
    path = tmp_path / f"plan-{schedule}-{ranks}-{m}.json"
    plan.write(plan.make_plan(d, solver.solve(d, cap), [cap] * d.schedule.num_stages, prof), path)
    return path


def _tfrun(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrun", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _stress_plan(tmp_path: Path, ratio: float = 0.9) -> Path:
    """A valid plan at cap `ratio` that freezes every backward action at exactly `ratio` (issue 9's check)."""
    from tfplan.plan import plan

    path = tmp_path / "plan-stress.json"
    plan.write(plan.with_uniform_ratio(plan.load(_plan(tmp_path)), ratio), path)
    plan.load(path)
    return path


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    torch_or_skip()
    return _plan(tmp_path_factory.mktemp("plan"))


@pytest.fixture(scope="module")
def full_run(plan_path, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The uninterrupted run every reliability test compares with: 8 steps, checkpoints every 2 (6 and 8 kept)."""
    out = tmp_path_factory.mktemp("full") / "run"
    proc = _tfrun("train", "--plan", str(plan_path), "--steps", "8", "--checkpoint-every", "2", "--out", str(out),
                  "--eval-every", "4", *FAST, *RECIPE)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def _resume(args: list[str], out: Path, work: Path) -> subprocess.CompletedProcess:
    """`tfrun train ARGS --resume OUT` on freshly spawned ranks (tests/shared_ranks.py: tfrun's CLI, launcher
    and worker without torchrun's processes): the tests below test the resume, and make what it resumes from
    (a signal, a killed rank) with real launches."""
    from tests import shared_ranks

    return shared_ranks.run_one(["tfrun", *args, "--resume", str(out)], work)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _sequence(out: Path) -> list[tuple]:
    """(loss, lr, grad_norm) of every step."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["loss"], r["lr"], r["grad_norm"]) for r in rows]


def _noise(out: Path) -> list:
    """The noise-scale estimates of the measured steps (--noise-every 5: steps 0 and 5), which carry the
    moving averages of every measured step before them (tfrun.freeze.noise: checkpointed)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["noise_scale_tokens"], r["grad_sq"]) for r in rows if "noise_scale_tokens" in r]


@pytest.mark.slow
def test_train_writes_metrics_summary_profile_and_checkpoint(full_run):
    from tfplan.cost import profile
    from tfplan.report import summary

    out, proc = full_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(8))
    for r in rows:
        assert {"loss", "step_time_ms", "tokens_per_s", "freeze_ratio"} <= set(r)
        assert len(r["freeze_ratio"]) == 2 and all(0 <= x <= 1 for x in r["freeze_ratio"])
    assert [r["step"] for r in rows if "eval_loss" in r] == [3, 7]
    data = summary.load(out / "summary.json")  # tfplan's validator accepts it
    for key in ("step_time_ms", "tokens_per_s", "predicted_step_ms", "prediction_error", "final_train_loss",
                "final_eval_loss"):
        assert data[key] is not None, key
    assert data["final_train_loss"] == rows[-1]["loss"] and data["timed_steps"] == 7 and data["timing_note"] is None
    prof = profile.load(out / "profile.json")  # tfplan's validator accepts it
    assert prof.source["kind"] == "measured" and len(prof.stages) == 2 and prof.stages[0].forward_ms > 0
    assert prof.source["num_ranks"] == 2
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 8
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest.json", "step0000006", "step0000008"]
    assert "step time" in proc.stdout  # the human summary table
    timings = json.loads((out / "timings.json").read_text())
    per_step = timings["step_durations"]  # every timed step's durations, whose medians are the table's
    assert sorted(per_step["ms"], key=int) == [str(s) for s in timings["timed_steps"]]
    for i, action in enumerate(per_step["actions"]):
        assert statistics.median(row[i] for row in per_step["ms"].values()) == pytest.approx(
            timings["actions"][action]["duration_ms"], abs=1e-3)
    from tfplan.report import explain

    variability = explain.explain(out, None).waits_split["variability"]  # a real run's waits split (not None)
    assert abs(variability) < json.loads((out / "summary.json").read_text())["step_time_ms"]


POLICIES = ("auto", "random", "prefix")
V_SCHEDULES = ("1f1b", "zbv", "dualpipev")


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """The runs of the tests below that test what a run does, not how its processes start, on one pair of rank
    processes (tests/shared_ranks.py: through tfrun's CLI, launcher and worker, with the process start-up paid
    once; a run is the one a separate launch makes, bit for bit where the run is deterministic): each freeze
    policy on the ratio-0.9 stress plan (40 steps, checkpoints every 10), each schedule's evaluation (2 steps,
    unfrozen), `tfplan profile` (its 4 measuring runs), an unfrozen run and `tfrun retime` of it and `auto`.
    Returns (folder, result by policy, schedule, "profile", "none" or "retime")."""
    torch_or_skip()
    from tests import shared_ranks

    root = tmp_path_factory.mktemp("shared")
    stress = _stress_plan(root)
    commands = {policy: ["tfrun", "train", "--plan", str(stress), "--steps", "40", "--checkpoint-every", "10",
                         "--out", str(root / policy), "--keep-checkpoints", "0", "--freeze-policy", policy, *FAST]
                for policy in POLICIES}
    (root / "eval").mkdir()
    for schedule in V_SCHEDULES:
        commands[schedule] = ["tfrun", "train", "--plan", str(_plan(root / "eval", schedule)), "--freeze", "none",
                              "--steps", "2", "--eval-every", "1", "--eval-batches", "1",
                              "--out", str(root / "eval" / schedule), *FAST]
    commands["profile"] = ["tfplan", "profile", "--model", "tiny", "--stages", "2", "--microbatches", "4", "--steps",
                           "3", "--microbatch-size", "1", "--seq-len", "16", "--output", str(root / "profile.json"),
                           "--work-dir", str(root / "profile-runs")]
    # the unfrozen run beside `auto`, and both re-timed side by side (tfrun.retime Note [paired time])
    commands["none"] = ["tfrun", "train", "--plan", str(stress), "--steps", "40", "--checkpoint-every", "0",
                        "--freeze", "none", "--eval-every", "10", "--out", str(root / "none"), *FAST]
    commands["retime"] = ["tfrun", "retime", str(root / "none"), str(root / "auto"), "--sample-every", "10",
                          "--block", "1", "--repeats", "2", "--out", str(root / "retime")]
    results = shared_ranks.run([(args, {}) for args in commands.values()], 2, root / "harness")
    return root, dict(zip(commands, results))


@pytest.mark.slow
def test_every_tensor_learns_between_checkpoints_at_ratio_0_9(shared_runs):
    torch = torch_or_skip()
    root, results = shared_runs
    summaries, models = {}, {}
    for policy in POLICIES:
        out = root / policy
        proc = results[policy]
        assert proc.returncode == 0, proc.stderr
        summaries[policy] = json.loads((out / "summary.json").read_text())
        models[policy] = [{(s, name): t for rank in (0, 1)
                           for s, state in torch.load(out / "checkpoints" / f"step{k:07d}" / f"rank{rank}.pt",
                                                      weights_only=False)["models"].items()
                           for name, t in state.items()} for k in (10, 20, 30, 40)]

    def unchanged(policy):
        return {key for a, b in zip(models[policy], models[policy][1:]) for key in a if torch.equal(a[key], b[key])}

    assert unchanged("auto") == set() and unchanged("random") == set()
    assert (0, "embed.weight") in unchanged("prefix")  # the check has teeth: a prefix starves stage 0's front
    auto = summaries["auto"]
    assert auto["final_eval_loss"] <= summaries["random"]["final_eval_loss"] * 1.01
    assert auto["longest_update_gap"] < 20 and auto["min_update_share"] > 0
    assert all(r <= p + 1e-9 for r, p in zip(auto["realised_freeze_ratio"], auto["planned_freeze_ratio"]))
    stats = json.loads((root / "auto" / "freeze_stats.json").read_text())
    assert {(row["stage"], row["name"]) for row in stats["tensors"]} == set(models["auto"][0])
    assert all(row["steps"] == 40 and 0 < row["steps_updated"] <= 40 for row in stats["tensors"])


@pytest.mark.slow
def test_retime_replays_what_each_run_froze_and_compare_pairs_the_gap(shared_runs):
    from tfrun.records import compare, frozen_sets, paired

    root, results = shared_runs
    for name in ("none", "auto", "retime"):
        assert results[name].returncode == 0, results[name].stderr
    # frozen_sets.jsonl is what the run froze: every tensor's (step, micro-batch) contributions in freeze_stats.json
    sets = frozen_sets.load(root / "auto")
    assert sorted(sets.steps) == list(range(40))
    stats = json.loads((root / "auto" / "freeze_stats.json").read_text())
    for row in stats["tensors"]:
        frozen = sum(row["name"] in mb for step in sets.steps.values() for mb in step[row["stage"]])
        assert frozen == 40 * 4 - row["contributions"], row["name"]
    assert not any(mb for step in frozen_sets.load(root / "none").steps.values() for stage in step for mb in stage)
    # the replay froze, action by action, what the runs recorded (its own check), a step in 10, 2 repeats
    result = paired.load(root / "retime" / "retime.json")
    assert result["mismatched_actions"] == 0 and result["repeats"] == 2
    drawn = [[n // 10 for n in repeat] for run in result["runs"] for repeat in run["steps"]]
    assert drawn == [[0, 1, 2, 3]] * 4  # one step drawn in each window of 10, per repeat
    assert result["runs"][0]["steps"] == result["runs"][1]["steps"]  # the same draws for both runs
    assert "next: tfrun compare" in results["retime"].stdout
    runs = [compare.load_run(root / "none"), compare.load_run(root / "auto")]
    rows = compare.compare(runs, runs[0], result)["runs"]
    assert rows[0]["eval_gap_same_time_paired"] == 0.0 and rows[0]["paired_speedup"] == 1.0
    assert rows[1]["eval_gap_same_time_paired"] is not None and len(rows[1]["eval_gap_same_time_paired_repeats"]) == 2
    assert rows[1]["paired_training_s"] > 0 and rows[1]["eval_gap_same_time"] is not None  # the raw one stays


@pytest.mark.slow
def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_continues_bit_for_bit(plan_path, full_run,
                                                                                        tmp_path):
    out = tmp_path / "part"
    args = ["train", "--plan", str(plan_path), "--steps", "8", "--checkpoint-every", "100", *FAST, *RECIPE]
    proc = subprocess.Popen([sys.executable, "-m", "tfrun", *args, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and len(_losses(out)) >= 2:
            proc.send_signal(signal.SIGTERM)  # to the launcher, as a scheduler would
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    step = json.loads((out / "checkpoints" / "latest.json").read_text())["step"]
    assert 2 <= step < 8 and len(_losses(out)) == step  # the step in flight finished, nothing after it
    assert (out / "checkpoints" / f"step{step:07d}" / "index.json").exists()
    assert f"stopped after step {step} of 8, checkpoint written; resume with: tfrun train" in stdout
    assert f"--resume {out}" in stdout and "Traceback" not in stderr
    assert _sequence(out) == _sequence(full_run[0])[:step]
    resumed = _resume(["train"], out, tmp_path / "resume")  # its settings from OUT/config.toml
    assert resumed.returncode == 0, resumed.stderr
    # bitwise: same batches, frozen sets, optimizer state, learning rates and gradient norms
    assert _sequence(out) == _sequence(full_run[0])


@pytest.mark.slow
def test_a_rank_sigkilled_mid_step_ends_the_job_fast_and_the_resume_is_exact(plan_path, full_run, tmp_path):
    out = tmp_path / "killed"
    args = ["train", "--plan", str(plan_path), "--steps", "8", "--checkpoint-every", "2", *FAST, *RECIPE]
    proc = _tfrun(*args, "--out", str(out), env={"TFRUN_FAULT": "1:5:kill"})  # SIGKILL 50 ms into step 5
    ended = time.time()
    assert proc.returncode == 1
    assert ended - (out / "metrics.jsonl").stat().st_mtime < 60  # from the end of step 4 to the job's exit
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: rank 1 was killed by signal 9"), lines[0]
    assert "last complete checkpoint: step 4 of 8" in lines[0] and f"--resume {out}" in lines[0]
    resumed = _resume(args, out, tmp_path / "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _sequence(out) == _sequence(full_run[0])
    assert [s for s, _, _ in _noise(out)] == [0, 5] and _noise(out) == _noise(full_run[0])  # resumed from step 4


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_makes_the_resume_fall_back_with_a_warning(plan_path, full_run, tmp_path):
    out = tmp_path / "damaged"
    shutil.copytree(full_run[0], out)
    rank_file = out / "checkpoints" / "step0000008" / "rank0.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:1000])
    (out / "metrics.jsonl").write_text("")  # the resume rewrites it from the checkpoint it uses
    proc = _resume(["train", "--plan", str(plan_path), "--steps", "8", "--checkpoint-every", "2", *FAST], out,
                   tmp_path / "resume")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: checkpoint step 8 is unusable: rank0.pt has 1000 bytes, the index says")
    assert "resuming from step 6" in proc.stderr
    assert _losses(out) == _losses(full_run[0])  # steps 6 and 7 trained again, identically
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 8


@pytest.mark.slow
def test_v_schedules_evaluate_like_the_others(shared_runs):
    """Note [forward-only evaluation]: torch's own eval() asserts on ZBV and DualPipeV; ours runs the F
    actions alone, so every schedule reports the same eval losses (the same model; float order aside)."""
    root, results = shared_runs
    evals = {}
    for schedule in V_SCHEDULES:
        out = root / "eval" / schedule
        proc = results[schedule]
        assert proc.returncode == 0, proc.stderr[-2000:]
        evals[schedule] = [r["eval_loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                           if "eval_loss" in r and "event" not in r]
        assert len(evals[schedule]) == 2
    for schedule in ("zbv", "dualpipev"):
        assert evals[schedule] == pytest.approx(evals["1f1b"], rel=1e-4)


@pytest.mark.slow
def test_joins_an_external_torchrun_job(plan_path, tmp_path):
    out = tmp_path / "ext"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "tfrun",
           "train", "--plan", str(plan_path), "--steps", "2", "--out", str(out), *FAST]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_fresh_ranks_train_like_forked_ones(plan_path, full_run, tmp_path):
    """tfrun.distributed.launch Note [forked ranks]: on a CUDA host each rank execs a fresh interpreter
    (TFRUN_FRESH_RANKS=1 takes that path here); the losses are those of the forked ranks, bit for bit."""
    out = tmp_path / "fresh"
    proc = _tfrun("train", "--plan", str(plan_path), "--steps", "8", "--checkpoint-every", "2", "--out", str(out),
                  "--eval-every", "4", *FAST, *RECIPE, env={"TFRUN_FRESH_RANKS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _sequence(out) == _sequence(full_run[0])


def _bad(args: list[str]) -> str:
    proc = _tfrun("train", *args, timeout=60)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_bad_input_gives_one_line_before_any_rank_starts(plan_path, tmp_path):
    """Through the real `python -m tfrun` process: exit code 1 and one line on stderr. Every other bad input
    (plans, options, data, checkpoints) is in tests/bad_inputs, run in-process (each process here costs a torch
    import, about 3 s)."""
    torch_or_skip()
    out = tmp_path / "never"
    assert "plan not found" in _bad(["--plan", str(tmp_path / "missing.json"), "--out", str(out)])
    assert "unknown model 'huge'" in _bad(["--plan", str(plan_path), "--model", "huge", "--out", str(out)])
    assert not out.exists()  # nothing started, nothing written


@pytest.mark.slow
def test_measured_profile_feeds_tfplan_solve(shared_runs):
    from typer.testing import CliRunner

    from tfplan.cli.app import app

    root, results = shared_runs
    prof, proc = root / "profile.json", results["profile"]
    assert proc.returncode == 0, proc.stderr
    data = json.loads(prof.read_text())
    assert data["source"]["kind"] == "measured" and len(data["stages"]) == 2
    s0, s1 = data["stages"]
    assert s0["backward_frozen_ms"] < s0["backward_ms"] and s1["backward_frozen_ms"] < s1["backward_ms"]
    assert s0["backward_input_ms"] < s1["backward_input_ms"]  # stage 0 needs no input gradient
    result = CliRunner().invoke(app, ["solve", "-p", str(prof), "-s", "1f1b", "-m", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["speedup"] >= 1.0
    # Note [profile at fixed weights]: every measuring run stepped its optimizer at learning rate 0, so the noise
    # section was measured at the initialisation, and the weights are still there at the end
    import torch

    from tfrun.models import MODELS, build_stage

    runs = sorted((root / "profile-runs").iterdir())
    assert len(runs) == 4 and all(_rows_lr(run) == {0.0} for run in runs)
    # Note [hook-free timings]: the noise run measures the noise on its even steps (as many as the others' steps)
    # and times only its odd ones, so no action time or step time carries the meter's hooks
    rows = [json.loads(line) for line in (root / "profile-runs" / "primary-none" / "metrics.jsonl").read_text()
            .splitlines() if "event" not in line]
    assert [r["step"] for r in rows if "noise_scale_tokens" in r] == [0, 2, 4]
    assert [r["step"] for r in rows if r["timed"]] == [3, 5]
    timings = json.loads((root / "profile-runs" / "primary-none" / "timings.json").read_text())
    assert timings["timed_steps"] == [3, 5]
    end = torch.load(root / "profile-runs" / "primary-none" / "checkpoints" / "step0000006" / "rank0.pt",
                     weights_only=False)["models"]
    start = build_stage(MODELS["tiny"], 0, 2, 0).state_dict()
    assert set(next(iter(end.values()))) == set(start)
    assert all(torch.equal(next(iter(end.values()))[name], start[name]) for name in start)
    assert "learning rate 0" in data["noise"]["note"]


def _rows_lr(run: Path) -> set[float]:
    return {json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if "event" not in line}

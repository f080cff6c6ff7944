"""`tfrun train` end to end on 2 gloo ranks (tiny model, short sequences): outputs, resume, bad input,
a dying rank, joining an external torchrun, and the measured profile feeding `tfplan solve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

FAST = ["--microbatch-size", "2", "--seq-len", "32", "--quiet"]


def _plan(tmp_path: Path, schedule: str = "1f1b", ranks: int = 2, m: int = 4, cap: float = 0.9) -> Path:
    from tfplan import dag, plan, profile, schedules, solver

    prof = profile.uniform(ranks, name="unit")
    d = dag.build(schedules.generate(schedule, ranks, m), prof)
    path = tmp_path / f"plan-{schedule}-{ranks}-{m}.json"
    plan.write(plan.make_plan(d, solver.solve(d, cap), [cap] * d.schedule.num_stages, prof), path)
    return path


def _tfrun(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrun", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _stress_plan(tmp_path: Path, ratio: float = 0.9) -> Path:
    """A valid plan at cap `ratio` that freezes every backward action at exactly `ratio` (issue 9's check)."""
    from tfplan import plan
    from tfplan.actions import FREEZABLE, parse_action

    obj = json.loads(_plan(tmp_path).read_text())
    for item in obj["actions"]:
        if parse_action(item["action"]).kind in FREEZABLE and item["max_ms"] > item["min_ms"]:
            item["freeze_ratio"] = ratio
    path = tmp_path / "plan-stress.json"
    path.write_text(json.dumps(obj))
    plan.load(path)
    return path


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    torch_or_skip()
    return _plan(tmp_path_factory.mktemp("plan"))


@pytest.mark.slow
def test_train_writes_metrics_summary_profile_and_checkpoint(plan_path, tmp_path):
    from tfplan import profile

    out = tmp_path / "run"
    proc = _tfrun("train", "--plan", str(plan_path), "--steps", "3", "--out", str(out), "--eval-every", "2", *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert {"loss", "step_time_ms", "tokens_per_s", "freeze_ratio"} <= set(r)
        assert len(r["freeze_ratio"]) == 2 and all(0 <= x <= 1 for x in r["freeze_ratio"])
    assert "eval_loss" in rows[1] and "eval_loss" in rows[2]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("step_time_ms", "tokens_per_s", "predicted_step_ms", "prediction_error", "final_train_loss",
                "final_eval_loss"):
        assert summary[key] is not None, key
    assert summary["final_train_loss"] == rows[-1]["loss"]
    prof = profile.load(out / "profile.json")  # tfplan's validator accepts it
    assert prof.source["kind"] == "measured" and len(prof.stages) == 2 and prof.stages[0].forward_ms > 0
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 3
    assert "step time" in proc.stdout  # the human summary table


@pytest.mark.slow
def test_every_tensor_learns_between_checkpoints_at_ratio_0_9(tmp_path):
    torch = torch_or_skip()
    stress = _stress_plan(tmp_path)
    summaries, models = {}, {}
    for policy in ("auto", "random", "prefix"):
        out = tmp_path / policy
        proc = _tfrun("train", "--plan", str(stress), "--steps", "40", "--checkpoint-every", "10", "--out", str(out),
                      "--freeze-policy", policy, *FAST)
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
    stats = json.loads((tmp_path / "auto" / "freeze_stats.json").read_text())
    assert {(row["stage"], row["name"]) for row in stats["tensors"]} == set(models["auto"][0])
    assert all(row["steps"] == 40 and 0 < row["steps_updated"] <= 40 for row in stats["tensors"])


@pytest.mark.slow
def test_resume_continues_the_same_loss_sequence(plan_path, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    args = ["--plan", str(plan_path), *FAST]
    assert _tfrun("train", *args, "--steps", "4", "--out", str(full)).returncode == 0
    assert _tfrun("train", *args, "--steps", "2", "--out", str(part)).returncode == 0
    proc = _tfrun("train", *args, "--steps", "4", "--resume", str(part))
    assert proc.returncode == 0, proc.stderr

    def losses(path):
        return [json.loads(line)["loss"] for line in (path / "metrics.jsonl").read_text().splitlines()]

    assert losses(part) == losses(full)  # bitwise: same batches, same frozen sets, same optimizer state


@pytest.mark.slow
def test_a_dying_rank_stops_the_job_and_is_named(plan_path, tmp_path):
    start = time.monotonic()
    proc = _tfrun("train", "--plan", str(plan_path), "--steps", "5", "--out", str(tmp_path / "r"), *FAST,
                  env={"TFRUN_FAULT": "1:2", "TFRUN_TIMEOUT_S": "30"})
    assert proc.returncode == 1
    assert time.monotonic() - start < 120
    line = proc.stderr.strip().splitlines()[0]
    assert line.startswith("error:") and "rank 1" in line, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_joins_an_external_torchrun_job(plan_path, tmp_path):
    out = tmp_path / "ext"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "tfrun",
           "train", "--plan", str(plan_path), "--steps", "2", "--out", str(out), *FAST]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def _bad(args: list[str]) -> str:
    proc = _tfrun("train", *args, timeout=60)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_bad_input_gives_one_line_before_any_rank_starts(plan_path, tmp_path):
    torch_or_skip()
    out = tmp_path / "never"
    common = ["--out", str(out)]
    assert "plan not found" in _bad(["--plan", str(tmp_path / "missing.json"), *common])
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "invalid JSON" in _bad(["--plan", str(broken), *common])
    assert "unknown model 'huge'" in _bad(["--plan", str(plan_path), "--model", "huge", *common])
    assert "not divisible into the plan's 4 micro-batches" in _bad(
        ["--plan", str(plan_path), "--global-batch", "10", *common])
    assert "--freeze must be one of" in _bad(["--plan", str(plan_path), "--freeze", "some", *common])
    assert "no checkpoint" in _bad(["--plan", str(plan_path), "--resume", str(tmp_path / "empty")])
    six = _plan(tmp_path, ranks=6, m=6)
    assert "fewer than the plan's 6 stages" in _bad(["--plan", str(six), *common])
    assert not out.exists()  # nothing started, nothing written


@pytest.mark.slow
def test_measured_profile_feeds_tfplan_solve(tmp_path):
    torch_or_skip()
    from typer.testing import CliRunner

    from tfplan.cli import app

    prof = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, "-m", "tfplan", "profile", "--model", "tiny", "--stages", "2",
                           "--microbatches", "4", "--steps", "3", "--microbatch-size", "1", "--seq-len", "16",
                           "--output", str(prof)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(prof.read_text())
    assert data["source"]["kind"] == "measured" and len(data["stages"]) == 2
    s0, s1 = data["stages"]
    assert s0["backward_frozen_ms"] < s0["backward_ms"] and s1["backward_frozen_ms"] < s1["backward_ms"]
    assert s0["backward_input_ms"] < s1["backward_input_ms"]  # stage 0 needs no input gradient
    result = CliRunner().invoke(app, ["solve", "-p", str(prof), "-s", "1f1b", "-m", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["speedup"] >= 1.0

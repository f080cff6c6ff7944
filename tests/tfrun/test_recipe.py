"""The training recipe end to end on 2 gloo ranks (issue 37): a diverging run stops at the step that was not
finite with one line and never checkpoints a NaN, and a resume with a sane learning rate trains on; --on-nonfinite
skip skips and records; every step row carries lr and grad_norm; TensorBoard's own reader loads the event files.
All commands run on one set of spawned ranks (tests/shared_ranks.py: tfrun's CLI, launcher and worker)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

FAST = ["--microbatch-size", "2", "--seq-len", "32", "--quiet", "--force", "--eval-batches", "1"]  # (eval: steps only)


def _rows(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _weights(files: list[Path]) -> list:
    import torch

    return [t for f in files for state in torch.load(f, weights_only=False)["models"].values() for t in state.values()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five commands on one pair of rank processes: (results, folders)."""
    torch_or_skip()
    from tests import shared_ranks
    from tests.tfrun.test_train import _plan

    tmp = tmp_path_factory.mktemp("recipe")
    plan = str(_plan(tmp))
    dirs = {name: tmp / name for name in ("huge-lr", "planted", "skip", "skip-limit")}
    kept = [(dirs["planted"] / "checkpoints" / "step0000004" / f"rank{r}.pt", tmp / f"planted-step4-rank{r}.pt")
            for r in (0, 1)]  # the newest checkpoint the stop left, before the resume prunes it
    train = ["tfrun", "train", "--plan", plan, *FAST]
    commands = [
        ([*train, "--steps", "6", "--lr", "1e30", "--checkpoint-every", "2", "--out", str(dirs["huge-lr"])], {}),
        ([*train, "--steps", "8", "--checkpoint-every", "2", "--out", str(dirs["planted"])],
         {"TFRUN_FAULT_INF_LOSS": "5:1"}, kept),  # micro-batch 1 of step 5: an infinite loss
        (["tfrun", "train", "--resume", str(dirs["planted"]), "--lr", "1e-4"], {}),  # OUT/config.toml: the rest
        ([*train, "--steps", "6", "--on-nonfinite", "skip", "--tensorboard", "--eval-every", "3",
          "--lr-schedule", "cosine", "--lr-warmup-steps", "2", "--clip-grad-norm", "1.0", "--out", str(dirs["skip"])],
         {"TFRUN_FAULT_INF_LOSS": "3:0"}),
        ([*train, "--steps", "6", "--on-nonfinite", "skip", "--max-skipped-steps", "1", "--out",
          str(dirs["skip-limit"])], {"TFRUN_FAULT_INF_LOSS": "2:0"}),
    ]
    return shared_ranks.run(commands, 2, tmp / "work"), dirs


@pytest.mark.slow
def test_a_diverging_run_stops_at_the_first_non_finite_step_with_one_line(runs) -> None:
    results, dirs = runs
    proc, out = results[0], dirs["huge-lr"]
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: ranks 0, 1 failed: NonFiniteStep: step 1: "), lines[0]
    assert "not finite" in lines[0] and "no complete checkpoint to resume from" in lines[0]
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["lr"] == 1e30 and math.isfinite(rows[0]["grad_norm"])
    assert rows[1]["loss"] is None and rows[1]["grad_norm"] is None and rows[1]["nonfinite"]
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").glob("step*"))


@pytest.mark.slow
def test_a_planted_inf_stops_its_step_keeps_finite_checkpoints_and_the_resume_trains_on(runs) -> None:
    torch = torch_or_skip()
    results, dirs = runs
    proc, out = results[1], dirs["planted"]
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[0]
    assert "step 5: the loss (stage 1) and the gradients of stages 0, 1 are not finite" in line, line
    assert "last complete checkpoint: step 4 of 8" in line and f"--resume {out}" in line
    newest = [out.parent / f"planted-step4-rank{r}.pt" for r in (0, 1)]
    assert all(bool(torch.isfinite(t).all()) for t in _weights(newest))
    resumed = results[2]
    assert resumed.returncode == 0, resumed.stderr
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(8))  # the resume rewrote steps 4-7 from the checkpoint
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert [r["lr"] for r in rows] == [3e-4] * 4 + [1e-4] * 4  # the resumed settings, --lr overridden
    config = (out / "config.toml").read_text()
    assert "lr = 0.0001" in config and "steps = 8" in config


@pytest.mark.slow
def test_skip_drops_the_step_records_it_and_trains_on(runs) -> None:
    results, dirs = runs
    proc, out = results[3], dirs["skip"]
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(6))
    assert rows[3]["skipped"] is True and rows[3]["loss"] is None and rows[3]["grad_norm"] is None
    assert not any(r.get("skipped") for r in rows[:3] + rows[4:])
    from tfrun.optim.lr_schedule import LrSchedule

    schedule = LrSchedule(name="cosine", total_steps=6, warmup_steps=2)
    assert [r["lr"] for r in rows] == [schedule.lr(3e-4, k) for k in range(6)]
    assert rows[0]["lr"] == 0.0  # step 0 of a warmup
    summary = json.loads((out / "summary.json").read_text())
    assert math.isfinite(summary["final_train_loss"])


@pytest.mark.slow
def test_tensorboards_reader_loads_the_scalars(runs) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, dirs = runs
    out = dirs["skip"]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss", "freeze_ratio/stage0",
            "freeze_ratio/stage1", "noise_scale_tokens/stage0"} <= tags, tags
    rows = _rows(out)
    lrs = [(e.step, e.value) for e in events.Scalars("train/lr")]
    assert lrs == [(r["step"], pytest.approx(r["lr"], rel=1e-6)) for r in rows]
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2, 4, 5]  # the skipped step had none
    assert [e.step for e in events.Scalars("eval/loss")] == [2, 5]


@pytest.mark.slow
def test_max_skipped_steps_in_a_row_end_the_run_as_stop_does(runs) -> None:
    results, _ = runs
    proc = results[4]
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[0]
    assert "step 2: " in line and "1 skipped steps in a row (--max-skipped-steps)" in line, line

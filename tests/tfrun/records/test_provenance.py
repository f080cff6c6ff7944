"""What a run may trust (tfrun.records.provenance, tfrun.cli.setup): a plan's profile against the run (refused unless
--force, which reports no prediction error), a resume against its checkpoint's identity, the output folder
before training, and the summary's caveats when no step was timed."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import BAD_INPUTS, torch_or_skip
from tfrun.config.train_config import TrainConfig
from tfrun.errors import TfrunError
from tfrun.records import provenance, summarize

PLAN = BAD_INPUTS / "valid-plan.json"
CONFIG = TrainConfig(order=[["0F0", "0B0"], ["1F0", "1B0"]], num_stages=2, num_microbatches=1, stage_to_rank=[0, 1],
                     model="tiny", microbatch_size=4, seq_len=128, threads=1)
MEASURED = {"kind": "measured", "model": "tiny", "microbatch_size": 4, "seq_len": 128, "device": "cpu",
            "threads_per_rank": 1, "torch": "2.13.0+cpu", "schedule": "1f1b", "num_ranks": 2}


def test_a_matching_or_uncheckable_profile_passes() -> None:
    assert provenance.profile_mismatch(MEASURED, CONFIG, "cpu") is None
    assert provenance.profile_mismatch({"kind": "hand", "note": "toy"}, CONFIG, "cpu") is None
    assert provenance.profile_mismatch({}, CONFIG, "cpu") is None  # a plan from before provenance
    assert provenance.profile_mismatch(MEASURED | {"torch": "2.14.0", "schedule": "gpipe"}, CONFIG, "cpu") is None
    analytic = {"kind": "analytic", "model": "tiny", "gpu": "h200", "microbatch_size": 4, "seq_len": 128}
    assert provenance.profile_mismatch(analytic, CONFIG, "NVIDIA H200") is None


@pytest.mark.parametrize(("source", "device", "differ"), [
    (MEASURED | {"model": "small"}, "cpu", "(model differs)"),
    (MEASURED | {"seq_len": 64}, "cpu", "(sequence length differs)"),
    (MEASURED | {"microbatch_size": 1, "seq_len": 64}, "cpu", "(micro-batch size, sequence length differ)"),
    (MEASURED | {"device": "NVIDIA H100 80GB HBM3"}, "cpu", "(device differs)"),
    (MEASURED, "NVIDIA H200", "(device differs)"),
    (MEASURED | {"threads_per_rank": 4}, "cpu", "(threads differs)"),
    ({"kind": "analytic", "model": "llama3.1-8b", "gpu": "h200"}, "cpu", "(model, device differ)"),
    ({"kind": "analytic", "gpu": "a100"}, "NVIDIA H200", "(device differs)"),
])
def test_a_mismatch_names_both_sides(source, device, differ) -> None:
    text = provenance.profile_mismatch(source, CONFIG, device)
    assert text is not None and text.endswith(differ) and "\n" not in text
    assert text.startswith(f"plan profiled ({source['kind']}) ") and "; this run is " in text


def test_the_first_example_of_the_issue() -> None:
    text = provenance.profile_mismatch(MEASURED | {"model": "small"}, CONFIG, "cpu")
    assert text == ("plan profiled (measured) model small, 4 x 128 tokens, on cpu, 1 thread per rank; this run is "
                    "model tiny, 4 x 128 tokens, on cpu, 1 thread per rank (model differs)")


def test_force_turns_the_refusal_into_a_prediction_note(monkeypatch) -> None:
    from tfrun.measure import profile as measured

    monkeypatch.setattr(measured, "run_device", lambda: "cpu")
    source = MEASURED | {"model": "small"}
    with pytest.raises(TfrunError, match=r"^p\.json: plan profiled .* pass --force to run it without a prediction$"):
        provenance.check_plan_profile("p.json", source, CONFIG, force=False)
    note = provenance.check_plan_profile("p.json", source, CONFIG, force=True)
    assert note.endswith("(model differs)")
    forced = dataclasses.replace(CONFIG, prediction_note=note, predicted_step_ms=10.0)
    out = summarize.caveats(forced, {"predicted_step_ms": 10.0, "prediction_error": 0.5, "timing_note": None})
    assert out["prediction_error"] is None and out["prediction_note"].endswith("(model differs)")
    assert summarize.caveats(CONFIG, {"predicted_step_ms": 10.0, "timing_note": None}) == {}


def test_no_timed_step_is_said_not_hidden() -> None:
    config = dataclasses.replace(CONFIG, predicted_step_ms=10.0, timing_warmup_steps=3)
    rows = [{"step": s, "loss": 1.0, "step_time_ms": 100.0 + s, "tokens_per_s": 1.0, "freeze_ratio": [0.0, 0.0],
             "timed": False} for s in range(2)]
    summary = summarize.summarize(config, rows, [], [])
    assert summary["timed_steps"] == 0 and summary["step_time_ms"] == 100.5
    assert summary["timing_note"].startswith("no timed step (steps 2 <= ramp 0 + timing warm-up 3)")
    summary |= summarize.caveats(config, summary)
    assert summary["prediction_error"] is None and "no timed step" in summary["prediction_note"]
    rows[1]["timed"] = True
    summary = summarize.summarize(config, rows, [], [])
    assert (summary["timed_steps"], summary["timing_note"], summary["step_time_ms"]) == (1, None, 101.0)


# Resume identity


def test_a_resume_must_keep_the_identity() -> None:
    stored = provenance.run_identity(CONFIG)
    assert provenance.identity_change(stored, CONFIG) is None
    assert provenance.identity_change({}, dataclasses.replace(CONFIG, lr=1.0)) is None  # nothing recorded
    for change, words in [({"seed": 7}, "--seed 0, this run has 7"),
                          ({"freeze": "none"}, "--freeze plan, this run has none"),
                          ({"microbatch_size": 2}, "--microbatch-size 4, this run has 2"),
                          ({"num_microbatches": 8}, "micro-batches per step 1, this run has 8"),
                          ({"freeze_policy": "skip"}, "--freeze-policy auto, this run has skip"),
                          ({"model": "small"}, "--model tiny, this run has small"),
                          ({"plan_hash": "sha256:" + "1" * 64}, "trained on a different plan than this run's")]:
        assert words in provenance.identity_change(stored, dataclasses.replace(CONFIG, **change)), change
    # the optimizer's recipe may change, with a warning naming each change (a diverged run resumed saner)
    saner = dataclasses.replace(CONFIG, lr=1e-3, clip_grad_norm=1.0)
    assert provenance.identity_change(stored, saner) is None
    warnings = provenance.recipe_changes(stored, saner)
    assert len(warnings) == 2 and "changes --lr from 0.0003 to 0.001" in warnings[0]
    assert "--clip-grad-norm from 0.0 to 1.0" in warnings[1] and provenance.recipe_changes(stored, CONFIG) == []
    # timely-only settings count only in timely runs
    assert provenance.identity_change(stored, dataclasses.replace(CONFIG, warmup_steps=9)) is None
    timely = dataclasses.replace(CONFIG, freeze="timely")
    assert "--warmup-steps 5, this run has 9" in provenance.identity_change(
        provenance.run_identity(timely), dataclasses.replace(timely, warmup_steps=9))


def _setup(tmp_path: Path, **options) -> TrainConfig:
    torch_or_skip()
    from tfrun.cli import setup

    defaults = dict(plan_path=str(PLAN), global_batch=None, microbatch_size=2, model="tiny", steps=4, seed=0,
                    out_dir=str(tmp_path / "run"), freeze="plan", seq_len=32, quiet=True)
    return setup.train_config(**(defaults | options))


def _fake_checkpoint(out: Path, step: int, config: TrainConfig) -> None:
    """A checkpoint folder as checkpoint.save writes it, with placeholder rank files."""
    folder = out / "checkpoints" / f"step{step:07d}"
    folder.mkdir(parents=True)
    files = {}
    for r in range(config.num_ranks):
        blob = f"rank {r}".encode()
        (folder / f"rank{r}.pt").write_bytes(blob)
        files[f"rank{r}.pt"] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (folder / "index.json").write_text(json.dumps({"schema_version": 1, "step": step, "world_size": config.num_ranks,
                                                   "time": 0.0, "files": files,
                                                   "run": provenance.run_identity(config)}))
    (out / "checkpoints" / "latest.json").write_text(json.dumps({"step": step, "world_size": config.num_ranks}))


def test_setup_records_hashes_and_refuses_a_changed_resume(tmp_path, capsys) -> None:
    config = _setup(tmp_path)
    assert config.plan_hash == provenance.sha256_bytes(PLAN.read_bytes()) and config.data_hash.startswith("sha256:")
    assert not (tmp_path / "run").exists()  # validation writes nothing
    _fake_checkpoint(tmp_path / "run", 2, config)
    resumed = _setup(tmp_path, resume=True, steps=8)
    assert resumed.resume_step == 2
    capsys.readouterr()
    _setup(tmp_path, resume=True, lr=1e-3)  # the recipe may change (Note [resume identity]), with a warning
    assert "warning: the resumed run changes --lr from 0.0003 to 0.001" in capsys.readouterr().err
    with pytest.raises(TfrunError, match=r"--resume .*run: the checkpoint was trained with --seed 0, this run "
                                         r"has 3; a resumed run must keep it"):
        _setup(tmp_path, resume=True, seed=3)
    with pytest.raises(TfrunError, match=r"the checkpoint was trained with --seq-len 32, this run has 64"):
        _setup(tmp_path, resume=True, seq_len=64)
    other_plan = tmp_path / "plan.json"
    other_plan.write_text(PLAN.read_text().replace('"created": "2026-12-01T00:00:00Z"', '"created": "2027"'))
    with pytest.raises(TfrunError, match="trained on a different plan than this run's"):
        _setup(tmp_path, resume=True, plan_path=str(other_plan))
    with pytest.raises(TfrunError, match="the checkpoint has 2 steps, more than --steps 1"):
        _setup(tmp_path, resume=True, steps=1)


def test_out_and_resume_must_agree(tmp_path) -> None:
    torch_or_skip()
    from tfrun.cli import setup

    assert setup.out_dir(None, None) == "runs/latest"
    assert setup.out_dir("a", None) == "a" and setup.out_dir(None, "b") == "b"
    assert setup.out_dir(str(tmp_path / "x"), str(tmp_path / "y" / ".." / "x")) == str(tmp_path / "y" / ".." / "x")
    with pytest.raises(TfrunError, match="^--out a and --resume b name different folders"):
        setup.out_dir("a", "b")
    for out, resume, flag in (("", None, "--out"), (None, " ", "--resume")):  # (an empty $OUT in a script)
        with pytest.raises(TfrunError, match=f"^{flag}: empty; give a folder"):
            setup.out_dir(out, resume)


def test_a_folder_that_holds_a_run_is_not_written_over(tmp_path) -> None:
    torch_or_skip()
    config = dataclasses.replace(CONFIG, order=[["0F0"], ["1F0"]], out_dir=str(tmp_path / "run"))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # (a new run replaced its checkpoints before)
    with pytest.raises(TfrunError, match=r"holds a run already .*; give a new folder, or --resume .* to continue it"):
        provenance.check_out(tmp_path / "run", config)
    assert provenance.check_out(tmp_path / "run", dataclasses.replace(config, resume=True)) == []
    default = dataclasses.replace(config, out_dir="runs/latest")  # the default is the one folder written over
    assert provenance.check_out(tmp_path / "run", default) == []


# The output folder


def test_the_output_folder_is_checked_before_training(tmp_path, monkeypatch) -> None:
    torch_or_skip()
    config = dataclasses.replace(CONFIG, order=[["0F0"], ["1F0"]])
    assert provenance.check_out(tmp_path / "new" / "run", config) == []
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(TfrunError, match="exists and is not a folder"):
        provenance.check_out(tmp_path / "file", config)
    with pytest.raises(TfrunError, match="is not a folder"):
        provenance.check_out(tmp_path / "file" / "run", config)
    need = provenance.checkpoint_bytes(config)
    assert need > 1e6  # the tiny model: parameters x 12 bytes

    def usage(free):
        return lambda path: shutil._ntuple_diskusage(10 * need, 10 * need - free, free)

    monkeypatch.setattr(shutil, "disk_usage", usage(need // 2))
    with pytest.raises(TfrunError, match=r"MiB free in .*, but one checkpoint needs about"):
        provenance.check_out(tmp_path / "run", config)
    monkeypatch.setattr(shutil, "disk_usage", usage(int(need * 1.5)))
    assert "room for fewer than the 3 checkpoints" in provenance.check_out(tmp_path / "run", config)[0]

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(provenance.tempfile, "TemporaryFile", read_only)
    with pytest.raises(TfrunError, match=r"cannot write in .* \(Read-only file system\)$"):
        provenance.check_out(tmp_path / "run", config)


def test_each_freeze_mode_is_compared_with_its_own_prediction(tmp_path) -> None:
    from tfplan.plan import plan as plan_mod

    predicted = plan_mod.load(PLAN).predicted
    assert _setup(tmp_path, freeze="plan").predicted_step_ms == predicted.planned_ms
    assert _setup(tmp_path, freeze="none").predicted_step_ms == predicted.no_freeze_ms
    assert _setup(tmp_path, freeze="all").predicted_step_ms == predicted.all_frozen_ms < predicted.no_freeze_ms


def test_setup_refuses_a_plan_for_another_model_unless_forced(tmp_path) -> None:
    other = str(PLAN.parent / "plans" / "other-model.json")
    with pytest.raises(TfrunError, match=r"plan profiled \(measured\) model small, 4 x 128 tokens"):
        _setup(tmp_path, plan_path=other, microbatch_size=4, seq_len=128)
    forced = _setup(tmp_path, plan_path=other, microbatch_size=4, seq_len=128, force=True)
    assert forced.prediction_note.endswith("(model differs)") and forced.predicted_step_ms is not None
    with pytest.raises(TfrunError, match=r"\(model differs\)"):  # the same rule for a timely seed plan
        _setup(tmp_path, plan_path=other, microbatch_size=4, seq_len=128, freeze="timely")
    assert _setup(tmp_path, plan_path=str(PLAN.parent / "plans" / "other-shape.json"), microbatch_size=4,
                  seq_len=128).prediction_note is None


def test_hf_models_compare_by_config_hash_and_the_dtype_is_compared() -> None:
    hf = dataclasses.replace(CONFIG, model="hf:/cluster/ckpt", model_hash="sha256:aa")
    same = MEASURED | {"model": "hf:/laptop/copy-of-ckpt", "model_hash": "sha256:aa", "dtype": "float32"}
    assert provenance.profile_mismatch(same, hf, "cpu") is None  # the same checkpoint in another folder
    assert provenance.profile_mismatch(same | {"model_hash": "sha256:bb"}, hf, "cpu").endswith("(model differs)")
    text = provenance.profile_mismatch(same | {"dtype": "bfloat16"}, hf, "cpu")
    assert text.endswith("(compute dtype (bfloat16 vs float32) differs)")
    assert provenance.identity_change(provenance.run_identity(hf), dataclasses.replace(hf, model_hash="sha256:bb")) \
        == "the checkpoint was trained with --model's config.json sha256:aa, this run has sha256:bb"

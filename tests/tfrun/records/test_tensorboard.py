"""tfrun.records.tensorboard: the rows metrics.jsonl gets, as TensorBoard scalars read back by TensorBoard's own
reader; and --tensorboard without the package is one line before anything is written. (A real run's event
files: tests/tfrun/test_recipe.py.)"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import BAD_INPUTS, torch_or_skip


def test_rows_become_scalars_tensorboard_reads(tmp_path) -> None:
    torch_or_skip()
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tfrun.records.tensorboard import TensorBoardLog

    log = TensorBoardLog(tmp_path)
    log.append([{"event": "phase", "step": 0},  # an event row: no scalars
                {"step": 0, "loss": 5.5, "lr": 0.0, "grad_norm": 3.0, "tokens_per_s": 900.0,
                 "freeze_ratio": [0.5, 0.25], "noise_scale_tokens": [180.0, None]},
                {"step": 1, "loss": None, "skipped": True, "lr": 1e-4, "grad_norm": None, "tokens_per_s": 950.0,
                 "freeze_ratio": [0.5, 0.25], "eval_loss": 5.0}])
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars["train/loss"] == [(0, 5.5)] and scalars["train/grad_norm"] == [(0, 3.0)]
    assert scalars["train/lr"] == [(0, 0.0), (1, pytest.approx(1e-4))] and scalars["eval/loss"] == [(1, 5.0)]
    assert scalars["freeze_ratio/stage1"] == [(0, 0.25), (1, 0.25)] and scalars["noise_scale_tokens/stage0"] == [
        (0, 180.0)] and "noise_scale_tokens/stage1" not in scalars


def test_without_the_package_the_option_is_one_line_and_writes_nothing(tmp_path, monkeypatch) -> None:
    torch_or_skip()
    from typer.testing import CliRunner

    from tfrun.cli.app import app
    from tfrun.distributed import launch

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now raises ImportError
    monkeypatch.setattr(launch, "launch", lambda config: pytest.fail("launched"))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--plan", str(BAD_INPUTS / "valid-plan.json"), "--tensorboard",
                                      "--out", str(out)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tensorboard needs the tensorboard package" in lines[0], result.stderr
    assert not out.exists()

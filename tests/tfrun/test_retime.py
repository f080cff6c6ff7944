"""tfrun.retime's launcher side: what it refuses before any rank starts, in one line (the replay itself runs in
tests/tfrun/test_train.py's shared runs: test_retime_replays_what_each_run_froze_and_compare_pairs_the_gap)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tfrun import retime  # noqa: E402
from tfrun.errors import TfrunError  # noqa: E402


def _finished(folder, **config) -> str:
    """A run folder as compare reads it (run_config.json, summary.json, metrics.jsonl), without frozen sets."""
    folder.mkdir()
    (folder / "run_config.json").write_text(json.dumps({"model": "tiny", "seed": 0, "freeze": "none", **config}))
    (folder / "summary.json").write_text(json.dumps({"schema_version": 5, "tokens_per_s": 1.0,
                                                     "final_train_loss": 1.0}))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0, "step_time_ms": 1.0}) + "\n")
    return str(folder)


def _call(runs: list[str], tmp_path, **kw) -> None:
    retime.retime(runs, baseline=kw.pop("baseline", None), out=str(tmp_path / "out"), sample_every=10, block=3,
                  repeats=3, **kw)


def test_refusals_name_what_is_wrong(tmp_path) -> None:
    none = _finished(tmp_path / "none")
    with pytest.raises(TfrunError, match="two or more run folders"):
        _call([none], tmp_path)
    plan = _finished(tmp_path / "plan", freeze="plan", freeze_method="grad")
    with pytest.raises(TfrunError, match="frozen_sets.jsonl does not exist"):
        _call([none, plan], tmp_path)
    header = '{"schema_version": 1, "tensors": []}\n'
    for folder in (none, plan):
        (tmp_path / folder / "frozen_sets.jsonl").write_text(header + '{"step": 0, "frozen": []}\n')
    with pytest.raises(TfrunError, match="differs from the baseline in freeze_method"):
        _call([none, plan], tmp_path)
    (tmp_path / "plan" / "run_config.json").write_text(json.dumps({"model": "tiny", "seed": 0, "freeze": "plan"}))
    (tmp_path / "plan" / "frozen_sets.jsonl").write_text(header)
    with pytest.raises(TfrunError, match="frozen_sets.jsonl has no step 0"):
        _call([none, plan], tmp_path)
    with pytest.raises(TfrunError, match="is a run's folder"):
        retime.retime([none, plan], baseline=None, out=plan, sample_every=10, block=3, repeats=3)
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "x"):  # (mkdir's OSError was a traceback)
        with pytest.raises(TfrunError, match="afile is a file, not a folder"):
            retime.retime([none, plan], baseline=None, out=out, sample_every=10, block=3, repeats=3)
    other = _finished(tmp_path / "other", seed=1)
    with pytest.raises(TfrunError, match="not comparable: seed"):
        _call([none, other], tmp_path)
    assert not (tmp_path / "out").exists()  # nothing written before the checks passed

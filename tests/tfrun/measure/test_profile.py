"""tfrun.measure.profile: metrics.jsonl's log (the measured profile is tested with real runs in test_train)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tfrun.measure.profile import MetricsLog  # noqa: E402


def test_metrics_log_restarts_from_the_resumed_rows_and_appends(tmp_path):
    log = MetricsLog(tmp_path, [{"step": 0}, {"step": 1}])
    log.append([{"event": "phase"}, {"step": 2}])
    log = MetricsLog(tmp_path, [{"step": 0}])  # a resume from the checkpoint after step 0
    log.append([{"step": 1}])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 0}, {"step": 1}]


def _row(**fields: float) -> dict[str, float]:
    base = dict.fromkeys(("backward_ms", "backward_frozen_ms", "backward_input_ms", "backward_weight_ms",
                          "backward_weight_frozen_ms"), 0.0)
    return base | fields


def test_a_run_of_both_backward_styles_keeps_what_it_measured():
    from tfrun.measure.profile import _derive_other_backward_style

    # DualPipeV unfrozen (stage 1 as measured, ms): B, I and W all timed; nothing derived over them
    row = _row(backward_ms=20.32, backward_input_ms=14.78, backward_weight_ms=9.99)
    _derive_other_backward_style(row, ["forward_ms", "backward_input_ms", "backward_ms", "backward_weight_ms"])
    assert row == _row(backward_ms=20.32, backward_input_ms=14.78, backward_weight_ms=9.99)
    # a full-backward schedule (1F1B) measures B only: I = frozen B, W = B - frozen B, frozen W = 0
    row = _row(backward_ms=40.0, backward_frozen_ms=15.0)
    _derive_other_backward_style(row, ["backward_ms", "backward_frozen_ms"])
    assert row == _row(backward_ms=40.0, backward_frozen_ms=15.0, backward_input_ms=15.0, backward_weight_ms=25.0)
    # a split schedule (ZBV) measures I and W: B = I + W, frozen B = I + frozen W
    row = _row(backward_input_ms=15.0, backward_weight_ms=25.0, backward_weight_frozen_ms=0.5)
    _derive_other_backward_style(row, ["backward_input_ms", "backward_weight_ms", "backward_weight_frozen_ms"])
    assert row == _row(backward_ms=40.0, backward_frozen_ms=15.5, backward_input_ms=15.0, backward_weight_ms=25.0,
                       backward_weight_frozen_ms=0.5)

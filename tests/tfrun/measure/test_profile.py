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

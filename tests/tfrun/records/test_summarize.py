"""tfrun.records.summarize on hand-built metrics: every figure is computed here by hand from the rows."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tfrun.config.train_config import TrainConfig  # noqa: E402
from tfrun.records.summarize import OnlineRecord, summarize  # noqa: E402

ORDER = [["0F0", "0B0"], ["1F0", "1B0"]]


def _config(**kw) -> TrainConfig:
    return TrainConfig(order=ORDER, num_stages=2, num_microbatches=1, stage_to_rank=[0, 1], **kw)


def _rows(step_ms: list[float], wall_ms: list[float], timed_from: int, ratios=None, evals=None) -> list[dict]:
    rows = []
    for step, (ms, wall) in enumerate(zip(step_ms, wall_ms)):
        row = {"step": step, "loss": 3.0 - step / 10, "step_time_ms": ms, "tokens": 512, "tokens_per_s": 512e3 / ms,
               "wall_ms": wall, "timed": step >= timed_from, "freeze_ratio": (ratios or {}).get(step, [0.0, 0.0])}
        if evals and step in evals:
            row |= {"eval_loss": evals[step], "eval_ms": 250.0}
        rows.append(row)
    return rows


def test_a_plan_run_takes_medians_after_the_ramp_and_totals_over_every_step():
    config = _config(freeze="plan", ramp_steps=2, predicted_step_ms=500.0, ratios={"1B0": 0.5})
    rows = _rows([900, 800, 500, 510, 490, 700], [1000, 900, 600, 560, 520, 800], timed_from=2,
                 ratios={s: [0.0, 0.5 * min(1, (s + 1) / 2)] for s in range(6)}, evals={2: 2.5, 5: 2.0})
    rows.insert(2, {"event": "phase", "phase": "x", "step": 2})  # events are not steps
    s = summarize(config, rows, [], [])
    assert s["step_time_ms"] == pytest.approx(505.0)  # median of 500, 510, 490, 700 (steps 2-5)
    assert s["timed_steps"] == 4 and s["steps"] == 6
    assert s["prediction_error"] == pytest.approx(0.01)
    assert s["tokens"] == 3072 and s["train_wall_s"] == pytest.approx(4.38) and s["eval_s"] == pytest.approx(0.5)
    assert s["wall_tokens_per_s"] == pytest.approx(3072 / 4.38)
    assert s["realised_freeze_ratio"] == pytest.approx([0.0, 0.5])  # steps 2-5, after the ramp
    assert s["planned_freeze_ratio"] == pytest.approx([0.0, 0.5]) and s["final_eval_loss"] == 2.0
    assert "plans" not in s


def test_an_online_run_reports_each_plan_against_its_own_steps_and_the_first_as_the_headline():
    bounds = [("warmup", 0, 2), ("monitor", 2, 4), ("probe", 4, 5), ("ramp", 5, 6), ("stable", 6, None)]
    plans = [{"step": 5, "predicted_ms": 400.0, "reason": "first plan"},
             {"step": 9, "predicted_ms": 450.0, "reason": "drift: stage 1 F x1.20"}]
    record = OnlineRecord(bounds=bounds, plans=plans, solve_s=[0.3, 0.2], planned_freeze_ratio=[0.5, 0.9])
    step_ms = [600] * 6 + [420, 440, 430, 460, 470, 480]
    wall_ms = [610, 610, 610, 610, 900, 610, 430, 450, 440, 470, 480, 490]  # step 4 carries the 0.3 s solve
    s = summarize(_config(freeze="timely"), _rows(step_ms, wall_ms, timed_from=1), [], [], record)
    assert s["step_time_ms"] == pytest.approx(450.0) and s["stable_step_time_ms"] == pytest.approx(450.0)
    assert s["timed_steps"] == 6  # the stable phase's
    first, second = s["plans"]
    assert (first["measured_ms"], first["steps"], first["error"]) == pytest.approx((430.0, 3, 0.075))
    assert (second["measured_ms"], second["steps"], second["error"]) == pytest.approx((470.0, 3, 20 / 450))
    assert s["predicted_step_ms"] == 400.0 and s["prediction_error"] == pytest.approx(0.075)  # the first plan
    assert s["stable_predicted_step_ms"] == 450.0 and s["stable_prediction_error"] == pytest.approx(20 / 450)
    assert s["outside_stable_share"] == pytest.approx(3950 / 6710)  # wall time, not step time (3600 / 6300)
    assert s["train_wall_s"] == pytest.approx(6.71) and s["replans"] == 1 and s["solve_s"] == [0.3, 0.2]
    assert [p["name"] for p in s["phases"]] == ["warmup", "monitor", "probe", "ramp", "stable"]
    assert s["phases"][-1]["end_step"] == 12 and s["planned_freeze_ratio"] == [0.5, 0.9]


def test_a_run_with_no_timed_step_in_force_says_so():
    s = summarize(_config(freeze="plan", ramp_steps=5, predicted_step_ms=500.0), _rows([700, 600], [710, 610], 5),
                  [], [])
    assert s["timed_steps"] == 0 and "no timed step" in s["timing_note"] and s["step_time_ms"] == 650.0

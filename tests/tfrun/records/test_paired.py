"""tfrun.records.paired: the gap at equal time on `tfrun retime`'s time axis. Closed forms on made-up runs: a
run whose raw wall times a slow spell of the machine inflated, re-timed side by side, gets the gap its re-timed
steps give; sampled steps stand for the steps after them; the time between steps is the run's own."""

from __future__ import annotations

import json

import pytest

from tfrun.errors import TfrunError
from tfrun.records import compare, paired


def _rows(step_ms: list[float], losses: dict[int, float], between_ms: float = 0.0) -> list[dict]:
    return [{"step": n, "step_time_ms": ms, "wall_ms": ms + between_ms, "tokens": 100,
             **({"eval_loss": losses[n]} if n in losses else {})} for n, ms in enumerate(step_ms)]


def _timing(steps: list[int], *repeats: list[float]) -> dict:
    return {"dir": "x", "steps": [steps] * len(repeats), "step_ms": [list(r) for r in repeats]}


def test_a_sampled_step_stands_for_its_window_plus_the_runs_own_time_between_steps() -> None:
    rows = _rows([999.0] * 5, {1: 3.0, 3: 2.0}, between_ms=10.0)  # raw step times do not matter
    points, seconds = paired.paired_points(rows, _timing([1, 2], [100.0, 300.0]), 0, every=2)
    assert points == [(1, pytest.approx(0.22), 3.0), (3, pytest.approx(0.84), 2.0)]  # 2 x 110 ms, + 2 x 310 ms
    assert seconds == pytest.approx(1.15)  # step 4's window was not replayed: the last one stands for it


def test_the_paired_gap_ignores_a_slow_spell_that_moved_the_raw_one() -> None:
    # The baseline's loss falls linearly 4 -> 2 over 8 steps; the method's steps cost half (re-timed: 50 against
    # 100 ms), and it ends at 2.5 after its 8 steps: at equal time (0.4 s) the baseline was at 3.0, a gap of
    # -1/6. The method's raw run met a slow spell (its steps 3x slower): its raw gap says it lost.
    base = _rows([100.0] * 8, {n: 4.0 - 2.0 * (n + 1) / 8 for n in range(8)})
    method = _rows([300.0] * 8, {7: 2.5})
    steps = list(range(8))
    base_axis = paired.paired_axis(base, _timing(steps, [100.0] * 8, [100.0] * 8), every=1)
    fields = paired.paired_fields(method, _timing(steps, [50.0] * 8, [52.0] * 8), base_axis, 800, 800,
                                  compare.loss_at, every=1)
    # repeat 2: 8 x 52 ms = 0.416 s, where the baseline was at 4 - 2.5 x 0.416 = 2.96
    assert fields["eval_gap_same_time_paired_repeats"] == pytest.approx([2.5 / 3.0 - 1, 2.5 / 2.96 - 1])
    assert fields["eval_gap_same_time_paired"] == pytest.approx((2.5 / 3.0 + 2.5 / 2.96) / 2 - 1)
    assert fields["eval_gap_same_time_paired_spread"] == pytest.approx(2.5 / 2.96 - 2.5 / 3.0)
    assert fields["paired_speedup"] == pytest.approx((2.0 + 100 / 52) / 2)
    raw = compare.loss_at(compare.Run(dir="b", config={}, summary={}, steps=base).eval_points, 2.4)
    assert raw is None  # the raw run took 2.4 s, past the baseline's last evaluation: no raw gap at all


def test_a_run_not_retimed_has_no_paired_columns() -> None:
    fields = paired.paired_fields(_rows([1.0], {0: 1.0}), None, [], 1, 1, compare.loss_at, 1)
    assert set(fields.values()) == {None}


def test_no_paired_gap_unless_every_repeat_gives_one() -> None:
    # repeat 2 re-times the method slower than the baseline's whole run: no baseline loss at its time, so no
    # median of the remaining repeat either (it would be biased towards the faster draws)
    base = _rows([100.0] * 4, {n: 4.0 - n * 0.5 for n in range(4)})
    method = _rows([100.0] * 4, {3: 2.4})
    base_axis = paired.paired_axis(base, _timing([0, 1, 2, 3], [100.0] * 4, [100.0] * 4), 1)
    fields = paired.paired_fields(method, _timing([0, 1, 2, 3], [50.0] * 4, [150.0] * 4), base_axis, 400, 400,
                                  compare.loss_at, 1)
    assert fields["eval_gap_same_time_paired"] is None and fields["paired_speedup"] == pytest.approx((2 + 2 / 3) / 2)


GOOD = {"schema_version": 1, "sample_every": 1, "mismatched_actions": 0}


@pytest.mark.parametrize("obj,expect", [
    ({"schema_version": 2}, "schema_version must be 1"),
    ({**GOOD, "sample_every": 0}, "sample_every must be an integer >= 1"),
    ({**GOOD, "mismatched_actions": 3}, "mismatched_actions is 3"),
    ({**GOOD, "runs": []}, "runs must be a non-empty list"),
    ({**GOOD, "runs": [{"dir": "a", "steps": [[0, 5]], "step_ms": [[1.0]]}]}, r"runs\[0\] needs"),
    ({**GOOD, "runs": [{"dir": "a", "steps": [[5, 0]], "step_ms": [[1.0, 1.0]]}]}, r"runs\[0\] needs"),
    ({**GOOD, "runs": [{"steps": [[0]], "step_ms": [[1.0]]}]}, r"runs\[0\] needs dir"),
    ({**GOOD, "runs": [{"dir": "a", "steps": [[0]], "step_ms": [[0.0]]}]}, "not positive"),
])
def test_a_bad_retime_file_is_one_line(tmp_path, obj, expect) -> None:
    path = tmp_path / "retime.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(TfrunError, match=expect):
        paired.load(path)
    with pytest.raises(TfrunError, match="does not exist"):
        paired.load(tmp_path / "missing.json")


def _launch(tmp_path, name: str, ms_base: list[list[float]], ms_method: list[list[float]], every: int = 1):
    path = tmp_path / f"{name}.json"
    steps = list(range(len(ms_base[0])))
    path.write_text(json.dumps({**GOOD, "sample_every": every, "runs": [
        {"dir": str(tmp_path / "base"), "steps": [steps] * len(ms_base), "step_ms": ms_base},
        {"dir": str(tmp_path / "method"), "steps": [steps] * len(ms_method), "step_ms": ms_method}]}))
    return path


def test_launches_join_and_the_paired_gap_is_the_median_over_launches_of_their_medians(tmp_path) -> None:
    # The method's loss curve: 3.0 at step 1 and 2.5 at step 3; the baseline's 3.0 at step 3 (and 4.0 at step 1):
    # the baseline's loss at the method's paired end time is interpolated, so each repeat's gap is closed-form.
    base = _rows([100.0] * 4, {1: 4.0, 3: 3.0})
    method = _rows([100.0] * 4, {1: 3.0, 3: 2.5})
    a = _launch(tmp_path, "a", [[100.0] * 4] * 3, [[50.0] * 4, [52.0] * 4, [54.0] * 4])
    b = _launch(tmp_path, "b", [[100.0] * 4], [[60.0] * 4])
    merged = paired.load_all([a, b])
    timing = paired.timing_of(merged, str(tmp_path / "method"))
    assert merged["launches"] == 2 and timing["launch"] == [0, 0, 0, 1] and len(timing["step_ms"]) == 4
    base_axis = paired.paired_axis(base, paired.timing_of(merged, str(tmp_path / "base")), 1)
    fields = paired.paired_fields(method, timing, base_axis, 400, 400, compare.loss_at, 1)
    gaps = fields["eval_gap_same_time_paired_repeats"]
    assert len(gaps) == 4 and gaps[0] < gaps[1] < gaps[2] < gaps[3]  # slower replays, later, higher baseline loss
    assert fields["eval_gap_same_time_paired_launches"] == pytest.approx([gaps[1], gaps[3]])
    assert fields["eval_gap_same_time_paired"] == pytest.approx((gaps[1] + gaps[3]) / 2)
    assert fields["eval_gap_same_time_paired_spread"] == pytest.approx(gaps[3] - gaps[0])
    with pytest.raises(TfrunError, match="sample_every 2 differs"):
        paired.load_all([a, _launch(tmp_path, "c", [[100.0] * 4], [[60.0] * 4], every=2)])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**GOOD, "runs": [{"dir": str(tmp_path / "base"), "steps": [[0]],
                                                   "step_ms": [[1.0]]}]}))
    with pytest.raises(TfrunError, match="re-times other runs"):
        paired.load_all([a, other])
    with pytest.raises(TfrunError, match="given twice"):
        paired.load_all([a, b, a])
    with pytest.raises(TfrunError, match="different numbers of repeats"):
        paired.load_all([_launch(tmp_path, "d", [[100.0] * 4] * 2, [[60.0] * 4])])

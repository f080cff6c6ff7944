"""tfrun.freeze.drift: the online mode's drift check (Note [drift]) on hand-made measurements."""

from __future__ import annotations

import time

import pytest

from tests.conftest import torch_or_skip


def _plan(**costs):
    from tfplan.cost import profile
    from tfplan.plan import plan
    from tfplan.schedule import schedules
    from tfplan.solve import solver
    from tfplan.step import dag

    prof = profile.uniform(2, **costs)
    d = dag.build(schedules.generate("1f1b", 2, 4), prof)
    return plan.make_plan(d, solver.solve(d, 0.5), [0.5, 0.5], prof)


def test_drift_leaves_out_partial_shares_and_scales_each_end_alone():
    torch_or_skip()
    from tfrun.freeze.drift import DriftMonitor, drift, scaled_profile

    p = _plan(forward_ms=10.0, backward_ms=40.0, backward_frozen_ms=20.0)
    # Stage 0's backward at a partial share saves far less than linear (a random subset there): ignored.
    rows = [(f"0B{m}", 39.0, 0.75) for _ in range(3) for m in range(4)]
    rows += [("0B1", 40.0, 0.0)] * 8  # unfrozen: as planned
    rows += [("1B2", 30.0, 1.0)] * 8  # frozen: 1.5x the planned 20 ms
    rows += [("1F0", 30.0, 0.0)] * 3  # too few samples to judge
    measured = drift(p, rows)
    assert measured == pytest.approx({"0B": 1.0, "1B-frozen": 1.5})
    monitor = DriftMonitor(window=5, threshold=0.1)
    # stage 1's unfrozen end had no sample: scaled as its frozen end (Note [unmeasured end]), not kept at 40 ms,
    # where the clamp frozen <= unfrozen would have made freezing stage 1 save 10 ms instead of 30
    drifted = monitor.drifted(measured)
    assert drifted == pytest.approx({"1B-frozen": 1.5, "1B~": 1.5})
    scaled = scaled_profile(p, drifted)
    assert scaled.stages[1].backward_frozen_ms == pytest.approx(30.0)
    assert scaled.stages[1].backward_ms == pytest.approx(60.0)
    assert scaled.stages[0] == p.dag.stage_costs[0] and scaled.name.endswith("-rescaled")
    # an end measured as planned stays as planned: each measured end is scaled alone
    drifted = monitor.drifted({**measured, "1B": 1.02})
    assert drifted == pytest.approx({"1B-frozen": 1.5})
    scaled = scaled_profile(p, drifted)
    assert scaled.stages[1].backward_frozen_ms == pytest.approx(30.0) and scaled.stages[1].backward_ms == 40.0
    # forward kinds have one end: nothing to infer
    assert monitor.drifted({"1F": 1.5}) == pytest.approx({"1F": 1.5})


def test_drift_is_the_median_ratio_of_measured_to_planned_times():
    torch_or_skip()
    from tfrun.freeze.drift import describe, drift, scaled_profile

    p = _plan(forward_ms=10.0, backward_ms=20.0, backward_frozen_ms=10.0)
    rows = [(f"1F{m}", 15.0, 0.0) for _ in range(3) for m in range(4)]  # stage 1 forward: 1.5x
    rows += [("0B0", 20.0, 0.0)] * 6 + [("0B2", 10.0, 1.0)] * 6  # enough samples of each end (MIN_DRIFT_SAMPLES)
    rows += [(f"0B{m}", 20.0 - 10.0 * share, share) for _ in range(3) for m, share in
             enumerate((0.0, 0.5, 1.0, 0.25))]  # stage 0 backward exactly as planned at both ends
    measured = drift(p, rows)
    assert measured == pytest.approx({"1F": 1.5, "0B": 1.0, "0B-frozen": 1.0})
    scaled = scaled_profile(p, {"1F": 1.5})
    assert scaled.stages[1].forward_ms == pytest.approx(15.0) and scaled.stages[0].backward_ms == 20.0
    assert describe({"1F": 1.5, "0B-frozen": 0.8}) == "drift: stage 0 B frozen x0.80, stage 1 F x1.50"
    assert describe({"1B-frozen": 1.9, "1B~": 1.9}) == ("drift: stage 1 B frozen x1.90, "
                                                        "stage 1 B x1.90 (not measured: as its other end)")


def test_the_monitor_keeps_two_windows_of_shares_and_checks_at_each_windows_end(tmp_path):
    torch = torch_or_skip()
    import torch.distributed as dist

    from tfrun.freeze.drift import DriftMonitor
    from tfrun.measure.timing import ActionTimer

    monitor = DriftMonitor(window=4, threshold=0.1)
    assert [s for s in range(20) if monitor.due(s, stable_start=6)] == [9, 13, 17]
    p = _plan(forward_ms=10.0, backward_ms=20.0, backward_frozen_ms=10.0)
    timer = ActionTimer(0, torch.device("cpu"))
    timer.enabled = True
    for step in range(12):
        monitor.record(step, {(0, 1): 1.0 if step % 2 else 0.0})
        timer.begin_step(step)
        for m in range(4):  # 0B1 at its planned time for the share it froze; 0B0 (never frozen) 2x slower
            ms = (0.01 if step % 2 else 0.02) if m == 1 else 0.04
            timer.time(f"0B{m}", time.sleep, ms)
        timer.end_step()
    assert sorted(monitor._shares) == list(range(4, 12))  # the last two windows only
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        measured = monitor.measure(11, timer, p)
    finally:
        dist.destroy_process_group()
    # the window is steps 8-11: 0B0, 0B2, 0B3 unfrozen at ~40 ms against 20 planned (12 samples), 0B1 two
    # unfrozen and two frozen samples (fewer than MIN_DRIFT_SAMPLES of each end: not judged)
    assert set(measured) == {"0B"} and measured["0B"] == pytest.approx(2.0, rel=0.25)


def test_steps_marked_unjudged_are_left_out_of_the_check(tmp_path):
    # tfrun.freeze.controller Note [unfrozen measurement]: a measured step's times (hooks, an unfrozen block) are
    # not the plan's, so the goodput mode marks them; the drift of the others alone is judged
    torch = torch_or_skip()
    import torch.distributed as dist

    from tfrun.freeze.drift import DriftMonitor
    from tfrun.measure.timing import ActionTimer

    p = _plan(forward_ms=10.0, backward_ms=20.0, backward_frozen_ms=10.0)
    monitor, timer = DriftMonitor(window=4, threshold=0.1), ActionTimer(0, torch.device("cpu"))
    timer.enabled = True
    for step in range(8):
        slow = step % 2 == 0  # every other step 3x slower, and unjudged
        monitor.record(step, {}, judged=not slow)
        timer.begin_step(step)
        for m in range(4):
            timer.time(f"0B{m}", time.sleep, 0.06 if slow else 0.02)
        timer.end_step()
    assert sorted(monitor._unjudged) == [0, 2, 4, 6]
    monitor.record(8, {})
    assert sorted(monitor._unjudged) == [2, 4, 6]  # forgotten with their shares, two windows on
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'pg'}")
    try:
        measured = monitor.measure(7, timer, p)
    finally:
        dist.destroy_process_group()
    # steps 5 and 7 only: 8 samples of 0B at ~20 ms, as planned (with the slow steps it would read ~2x)
    assert measured["0B"] == pytest.approx(1.0, rel=0.3)

"""tfrun.freeze.noise_estimators on hand-made per-step estimates: the published form is the bias-corrected moving
average, the window forms ignore (median) or bound (winsor) one outlier step, skipped tensors stay as they were,
and the state survives a resume, also with a longer window."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tfrun.freeze.noise_estimators import NOISE_EMA, TensorNoise  # noqa: E402

STEADY = [400.0, 420.0, 380.0, 410.0, 390.0, 430.0, 405.0]


def _fill(estimator: str, traces: list[float], window: int = 8) -> TensorNoise:
    noise = TensorNoise(estimator, 2, window=window)
    for t in traces:
        noise.add(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([t, 2 * t], dtype=torch.float64),
                  torch.tensor([True, True]))
    return noise


def test_ema_is_the_bias_corrected_moving_average() -> None:
    noise = _fill("ema", STEADY[:3])
    a = NOISE_EMA
    raw = (1 - a) * (a * a * 400 + a * 420 + 380)
    assert noise.values()[1][0].item() == pytest.approx(raw / (1 - a ** 3), rel=1e-12)
    assert noise.stage() == pytest.approx((3.0, 3 * raw / (1 - a ** 3)), rel=1e-12)


@pytest.mark.parametrize("estimator,bound", [("median", 1.05), ("winsor", 1.2), ("ema", None)])
def test_one_outlier_step(estimator: str, bound: float | None) -> None:
    calm, spiked = _fill(estimator, STEADY + [410.0]), _fill(estimator, STEADY + [40_000.0])
    ratio = spiked.values()[1][0].item() / calm.values()[1][0].item()
    if bound is None:
        assert ratio > 5  # the published form holds the outlier's weight
    else:
        assert ratio <= bound


def test_two_values_are_never_clipped_and_an_empty_window_gives_nothing() -> None:
    assert _fill("winsor", [100.0, 300.0]).values()[1][0].item() == pytest.approx(200.0)
    empty = TensorNoise("winsor", 2)
    assert empty.stage() is None and not empty.values()[2].any()


def test_a_skipped_or_non_finite_tensor_keeps_its_estimate() -> None:
    for estimator in ("ema", "median", "winsor"):
        noise = _fill(estimator, STEADY)
        before = noise.values()[1].clone()
        noise.add(torch.tensor([math.nan, 5.0], dtype=torch.float64), torch.tensor([1.0, 7.0], dtype=torch.float64),
                  torch.tensor([False, True]))
        assert noise.values()[1][0].item() == pytest.approx(before[0].item())


def test_state_survives_a_resume_and_a_longer_window_keeps_the_newest_steps() -> None:
    short = _fill("winsor", STEADY, window=3)
    again = TensorNoise("winsor", 2, window=3)
    again.load_state_dict(short.state_dict())
    assert torch.equal(again.values()[1], short.values()[1])
    longer = TensorNoise("winsor", 2, window=8)
    longer.load_state_dict(short.state_dict())
    assert longer.values()[1][0].item() == pytest.approx(_fill("winsor", STEADY[-3:]).values()[1][0].item())
    longer.add(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([500.0, 1000.0], dtype=torch.float64),
               torch.tensor([True, True]))
    assert longer.values()[1][0].item() == pytest.approx(_fill("winsor", STEADY[-3:] + [500.0]).values()[1][0].item())


def test_log_spread_is_the_jackknife_standard_error_of_the_log_noise_scale() -> None:
    # |G|^2 = 3 every step (1 + 2), tr(Sigma) = 3 t: no value is clipped (median +- 4.4 MAD holds them all), so
    # leaving step k out gives the mean of the others, and the stage's noise scale is that mean of t
    traces = [1.0, 2.0, 3.0, 4.0]
    noise = _fill("winsor", traces)
    theta = [math.log(sum(traces[:k] + traces[k + 1:]) / 3) for k in range(4)]
    mean = sum(theta) / 4
    assert noise.log_spread() == pytest.approx(math.sqrt(3 / 4 * sum((x - mean) ** 2 for x in theta)), rel=1e-12)
    assert _fill("winsor", [400.0] * 5).log_spread() == 0.0  # a steady stage: no spread
    # more scatter, more spread; an outlier step is bounded by the clipping, not passed through
    assert _fill("winsor", [300.0, 500.0, 350.0, 450.0, 400.0]).log_spread() > \
        _fill("winsor", STEADY[:5]).log_spread()
    assert _fill("winsor", STEADY + [40_000.0]).log_spread() < 0.5


def test_log_spread_needs_a_window_of_three_steps_and_a_resolved_noise_scale() -> None:
    assert _fill("ema", STEADY).log_spread() is None  # no window to leave a step out of
    assert _fill("winsor", STEADY[:2]).log_spread() is None
    assert _fill("median", STEADY[:3]).log_spread() is not None
    noise = TensorNoise("winsor", 1, window=4)
    for gsq in (1.0, -1.0, -1.0):  # without the first step, |G|^2 is not positive: the stage is not resolved
        noise.add(torch.tensor([gsq], dtype=torch.float64), torch.tensor([5.0], dtype=torch.float64),
                  torch.tensor([True]))
    assert noise.log_spread() == math.inf


def test_leave_one_out_gives_the_stage_sums_with_each_step_left_out() -> None:
    # tfrun.freeze.controller Note [learning gate]: the jackknife of every input of the learning model
    noise = _fill("winsor", [1.0, 2.0, 3.0, 4.0])  # |G|^2 = (1, 2) every step, tr(Sigma) = (t, 2 t)
    numel = torch.tensor([4.0, 9.0], dtype=torch.float64)
    full, out = noise.leave_one_out(numel)
    update = 2.0 * 1.0 + 3.0 * math.sqrt(2.0)  # sqrt(n |G|^2) summed over the tensors
    assert full == pytest.approx((3.0, 3 * 2.5, update))
    assert sorted(out) == [0, 1, 2, 3]
    assert out[0] == pytest.approx((3.0, 3 * 3.0, update))  # without t = 1 the mean of t is 3
    assert _fill("ema", STEADY).leave_one_out(numel)[1] == {}  # no window: no jackknife

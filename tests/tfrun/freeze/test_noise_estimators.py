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

"""tfrun.optim.lr_schedule against transformers' schedules, step by step to 1e-12, and its bad settings."""

from __future__ import annotations

import math

import pytest

from tfrun.optim.lr_schedule import LrSchedule

SETTINGS = [(steps, warmup) for steps in (1, 7, 30, 100) for warmup in (0, 1, 3, 10) if warmup <= steps]


def _transformers_factors(kind: str, steps: int, warmup: int, floor: float = 0.0, decay: int = 1) -> list[float]:
    """transformers' LambdaLR factors for optimizer steps 0 .. steps - 1 (its lr_lambdas, evaluated per step)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers.optimization")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if kind == "constant":
        sched = transformers.get_constant_schedule_with_warmup(opt, warmup)
    elif kind == "linear":
        sched = transformers.get_linear_schedule_with_warmup(opt, warmup, steps)
    elif kind == "cosine" and floor == 0.0:
        sched = transformers.get_cosine_schedule_with_warmup(opt, warmup, steps)
    elif kind == "cosine":
        sched = transformers.get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, steps, min_lr_rate=floor)
    else:
        sched = transformers.get_wsd_schedule(opt, warmup, decay, num_training_steps=steps, min_lr_ratio=floor)
    return [sched.lr_lambdas[0](k) for k in range(steps)]


@pytest.mark.parametrize("steps,warmup", SETTINGS)
@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_equals_transformers_at_every_step(kind: str, steps: int, warmup: int) -> None:
    ours = LrSchedule(name=kind, total_steps=steps, warmup_steps=warmup)
    assert ours.problem() is None
    theirs = _transformers_factors(kind, steps, warmup)
    assert [ours.factor(k) for k in range(steps)] == pytest.approx(theirs, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("floor", [0.05, 0.1, 0.5])
@pytest.mark.parametrize("steps,warmup", [(30, 3), (100, 10), (7, 0)])
def test_cosine_with_a_floor_equals_transformers_min_lr_form(floor: float, steps: int, warmup: int) -> None:
    ours = LrSchedule(name="cosine", total_steps=steps, warmup_steps=warmup, min_ratio=floor)
    theirs = _transformers_factors("cosine", steps, warmup, floor)
    assert [ours.factor(k) for k in range(steps)] == pytest.approx(theirs, rel=1e-12, abs=1e-12)
    assert min(ours.factor(k) for k in range(warmup, steps)) >= floor


@pytest.mark.parametrize("floor", [0.0, 0.1])
@pytest.mark.parametrize("steps,warmup,fraction", [(30, 3, 0.2), (100, 10, 0.1), (10, 0, 1.0), (9, 2, 0.25)])
def test_wsd_equals_transformers(floor: float, steps: int, warmup: int, fraction: float) -> None:
    ours = LrSchedule(name="wsd", total_steps=steps, warmup_steps=warmup, min_ratio=floor, decay_fraction=fraction)
    assert ours.problem() is None
    theirs = _transformers_factors("wsd", steps, warmup, floor, ours.decay_steps)
    assert [ours.factor(k) for k in range(steps)] == pytest.approx(theirs, rel=1e-12, abs=1e-12)
    stable = range(warmup, steps - ours.decay_steps)
    assert all(ours.factor(k) == 1.0 for k in stable)


def test_linear_floor_is_the_floor_form_of_transformers_linear() -> None:
    plain = LrSchedule(name="linear", total_steps=20, warmup_steps=4)
    floored = LrSchedule(name="linear", total_steps=20, warmup_steps=4, min_ratio=0.2)
    for k in range(20):
        expected = plain.factor(k) if k < 4 else plain.factor(k) * 0.8 + 0.2
        assert floored.factor(k) == pytest.approx(expected, rel=1e-15)


def test_step_0_of_a_warmup_has_lr_0_and_the_peak_is_lr() -> None:
    for kind in ("constant", "linear", "cosine", "wsd"):
        s = LrSchedule(name=kind, total_steps=50, warmup_steps=5, decay_fraction=0.2)
        assert s.lr(3e-4, 0) == 0.0 and s.lr(3e-4, 5) == 3e-4


def test_the_default_is_constant_lr_bit_for_bit() -> None:
    s = LrSchedule(total_steps=10)
    assert all(s.lr(3e-4, k) == 3e-4 for k in range(10))  # earlier runs stay reproducible


@pytest.mark.parametrize("settings,expected", [
    ({"name": "exponential"}, "--lr-schedule must be one of constant, cosine, linear, wsd"),
    ({"warmup_steps": 31}, "--lr-warmup-steps must be in [0, --steps] (30)"),
    ({"warmup_steps": -1}, "--lr-warmup-steps must be in"),
    ({"min_ratio": 1.5}, "--lr-min-ratio must be in [0, 1]"),
    ({"min_ratio": math.nan}, "--lr-min-ratio must be in [0, 1]"),
    ({"decay_fraction": 0.0}, "--lr-decay-fraction must be in (0, 1]"),
    ({"decay_fraction": 1.5}, "--lr-decay-fraction must be in (0, 1]"),
    ({"name": "wsd", "warmup_steps": 28, "decay_fraction": 0.2}, "exceed --steps 30"),
])
def test_bad_settings_name_the_option(settings: dict, expected: str) -> None:
    problem = LrSchedule(total_steps=30, **settings).problem()
    assert problem is not None and expected in problem

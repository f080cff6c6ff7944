"""Learning-rate schedules, step by step the values of transformers' `get_*_schedule_with_warmup` and
`get_wsd_schedule` for the same settings (tests/tfrun/optim/test_lr_schedule.py compares them to 1e-12).

The learning rate of optimizer step k (k = 0 for the run's first step) is `--lr` x factor(k):
  constant  linear warmup from 0 over `warmup_steps`, then 1 (get_constant_schedule_with_warmup)
  cosine    warmup, then a half cosine from 1 to `min_ratio` at the last step (get_cosine_schedule_with_warmup;
            with min_ratio > 0, get_cosine_with_min_lr_schedule_with_warmup's min_lr_rate)
  linear    warmup, then a straight line from 1 to `min_ratio` (get_linear_schedule_with_warmup at min_ratio 0;
            transformers has no floor form: ours is min_ratio + (1 - min_ratio) x its factor)
  wsd       warmup, stable at 1, and a cosine decay to `min_ratio` over the last `decay_fraction` of the steps
            (get_wsd_schedule with its defaults: linear warmup, cosine decay; like it, the warmup starts at
            min_ratio, not 0, when min_ratio > 0)
Step 0 of a warmup has learning rate 0 (min_ratio x --lr under wsd). The factor is a function of the step
alone, so a resumed run continues the same sequence without state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "cosine", "linear", "wsd")


@dataclass(frozen=True, kw_only=True, slots=True)
class LrSchedule:
    """A schedule of the learning rate's factor over a run of `total_steps` optimizer steps."""

    name: str = "constant"
    """constant, cosine, linear or wsd."""
    total_steps: int
    """Optimizer steps in the run (--steps), counting resumed ones."""
    warmup_steps: int = 0
    """Steps of linear warmup from 0 (--lr-warmup-steps)."""
    min_ratio: float = 0.0
    """The decay's floor, a fraction of --lr (--lr-min-ratio); unused by constant."""
    decay_fraction: float = 0.1
    """wsd: the share of the run's last steps that decay (--lr-decay-fraction)."""

    @property
    def decay_steps(self) -> int:
        """wsd: steps of the decay, the nearest whole number to decay_fraction x total_steps (at least 1).

        >>> LrSchedule(name="wsd", total_steps=30, decay_fraction=0.25).decay_steps
        8
        """
        return max(1, math.floor(self.decay_fraction * self.total_steps + 0.5))

    def problem(self) -> str | None:
        """What is wrong with these settings, in one line naming the option; None when nothing is."""
        if self.name not in SCHEDULES:
            return f"--lr-schedule must be one of {', '.join(SCHEDULES)}, got {self.name!r}"
        if not 0 <= self.warmup_steps <= self.total_steps:
            return (f"--lr-warmup-steps must be in [0, --steps] ({self.total_steps}): a warmup longer than the run "
                    f"never reaches --lr, got {self.warmup_steps}")
        if not 0.0 <= self.min_ratio <= 1.0:  # (NaN fails too)
            return f"--lr-min-ratio must be in [0, 1], got {self.min_ratio}"
        if not 0.0 < self.decay_fraction <= 1.0:
            return f"--lr-decay-fraction must be in (0, 1], got {self.decay_fraction}"
        if self.name == "wsd" and self.warmup_steps + self.decay_steps > self.total_steps:
            return (f"--lr-schedule wsd: --lr-warmup-steps {self.warmup_steps} and the decay's {self.decay_steps} "
                    f"steps (--lr-decay-fraction {self.decay_fraction:g}) exceed --steps {self.total_steps}")
        return None

    def factor(self, step: int) -> float:
        """The learning rate at optimizer step `step` over the peak (--lr).

        >>> s = LrSchedule(name="cosine", total_steps=10, warmup_steps=2)
        >>> [round(s.factor(k), 4) for k in (0, 1, 2, 6, 10)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
        """
        warm, total, floor = self.warmup_steps, self.total_steps, self.min_ratio
        if self.name == "wsd":
            return _wsd(step, warm, total - warm - self.decay_steps, self.decay_steps, floor)
        if step < warm:
            return float(step) / float(max(1, warm))
        if self.name == "constant":
            return 1.0
        progress = float(step - warm) / float(max(1, total - warm))
        if self.name == "cosine":
            value = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
        else:  # linear, as transformers writes it: (total - step) / (total - warm)
            value = float(total - step) / float(max(1, total - warm))
        return max(0.0, value * (1 - floor) + floor) if floor else max(0.0, value)

    def lr(self, base_lr: float, step: int) -> float:
        """The learning rate (the optimizer's unit) at optimizer step `step`."""
        return base_lr * self.factor(step)


def _wsd(step: int, warm: int, stable: int, decay: int, floor: float) -> float:
    """get_wsd_schedule's factor with its defaults (linear warmup, cosine decay, half a cycle)."""
    if step < warm:
        return max(0.0, float(step) / float(max(1, warm)) * (1.0 - floor) + floor)
    if step < warm + stable:
        return 1.0
    if step < warm + stable + decay:
        progress = float(step - warm - stable) / float(max(1, decay))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)) * (1.0 - floor) + floor)
    return floor

"""How the measured steps' noise estimates combine into one value per tensor and per stage (`--noise-estimator`).

Note [robust noise]: every measured step gives, per tensor, unbiased but noisy estimates of |G|^2 and tr(Sigma)
(tfrun.freeze.noise Note [noise scale]). A stage's noise scale is the ratio of their sums over its tensors, each
smoothed over the measured steps. How to smooth:
  ema     the published form (McCandlish et al., appendix A): exponential moving averages (factor NOISE_EMA,
          bias-corrected) of both, then their ratio. One outlier step enters both averages with the same weight,
          so the ratio stays near the outlier's until later steps outweigh it (measured: stage 0 of the tiny model
          held at 9x its value for 8 steps after one, docs/cost-model.md, "Which noise estimator").
  median  per tensor, the median of each over the last `window` measured steps: one outlier step (or tensor)
          moves nothing, but a skewed distribution's median is below its mean.
  winsor  per tensor, the mean over the last `window` measured steps after clipping each value into
          median +- 3 x 1.4826 MAD of the window (the MAD scaled to a normal's standard deviation): an outlier
          counts as a large but ordinary value, and the mean of everything else is kept.
A |G|^2-weighted mean of per-tensor noise scales tr_i / |G_i|^2 is the ratio of the sums again, so it is not a
separate candidate. The default is chosen by measurement (docs/cost-model.md, "Which noise estimator"):
tfrun.config.train_config.DEFAULT_NOISE_ESTIMATOR. Every estimator keeps per-tensor values, which the goodput
freeze policy reads (tfrun.freeze.candidates.goodput_priority) and noise_tensors.json reports.

Note [noise gate]: the online goodput mode re-plans when a stage's noise scale has moved since its plan
(tfrun.freeze.online Note [online goodput]). A window of 8 measured steps scatters by tens of percent from one
window to the next even where the true value is steady (docs/results.md, third edition: 8-11 of a fine-tuning
run's 10-15 re-plans moved the plan back and forth), so under `--noise-replan-z Z` a move counts only beyond Z
standard errors of the two estimates. The standard error is the jackknife's over the window's steps: with
theta_k the log noise scale from the window without step k (n steps), se = sqrt((n - 1) / n sum (theta_k -
mean theta)^2); on the log scale because the noise scale is a ratio and its moves are relative. The jackknife of
a median is known to be inconsistent (too few distinct leave-one-out values); for the winsorised mean, the
default, it is the usual one. Consecutive drift checks' windows overlap when the window spans more steps than
--replan-window, which makes their difference's true spread smaller than the independent sum assumed: the gate
errs towards not re-planning. Measured (docs/results.md, "A gate on noise re-plans"): standard errors of
0.13-1.28 at the default window, so at Z = 2 only moves beyond about x2.3-x5.5 count; the noise re-plans of nine
study runs fell from 59 to 9, but the gap at equal time moved by -0.33 pp on average, so the gate is off by
default.
"""

from __future__ import annotations

import math

import torch

from tfrun.config.train_config import DEFAULT_NOISE_WINDOW as DEFAULT_WINDOW
from tfrun.config.train_config import MIN_JACKKNIFE
from tfrun.config.train_config import NOISE_ESTIMATORS as ESTIMATORS

NOISE_EMA = 0.9
"""Factor of the `ema` estimator's moving averages over measured steps."""
MAD_CLIP = 3.0 * 1.4826
"""winsor: values beyond this many scaled median absolute deviations from the window's median are clipped."""


class TensorNoise:
    """One stage's per-tensor |G|^2 and tr(Sigma), smoothed over measured steps by one estimator."""

    def __init__(self, estimator: str, num_tensors: int, window: int = DEFAULT_WINDOW,
                 device: torch.device | None = None) -> None:
        assert estimator in ESTIMATORS and window >= 1, (estimator, window)
        self.estimator, self.window = estimator, window
        zeros = torch.zeros(num_tensors, dtype=torch.float64, device=device)
        self.counts = zeros.clone()
        """Per tensor, measured steps that gave it an estimate."""
        self.ema = torch.stack([zeros, zeros])
        """ema: (|G|^2, tr(Sigma)) x tensor, bias-uncorrected moving averages."""
        self.history = torch.full((window, 2, num_tensors), float("nan"), dtype=torch.float64, device=device)
        """median, winsor: the last `window` measured steps' estimates per tensor (NaN: none that step)."""
        self.steps = 0
        """Measured steps folded in."""

    def add(self, gsq: torch.Tensor, trace: torch.Tensor, usable: torch.Tensor) -> None:
        """One measured step's per-tensor estimates; only `usable` tensors' count (a tensor reached by fewer
        than two micro-batches, or a value that is not finite, leaves that tensor as it was)."""
        both = torch.stack([gsq, trace])
        if self.estimator == "ema":
            self.ema = torch.where(usable, NOISE_EMA * self.ema + (1 - NOISE_EMA) * both, self.ema)
        else:
            self.history[self.steps % self.window] = torch.where(usable, both, torch.full_like(both, float("nan")))
        self.counts += usable.double()
        self.steps += 1

    def values(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per tensor: (|G|^2, tr(Sigma), whether it has an estimate)."""
        have = self.counts > 0
        if self.estimator == "ema":
            weight = (1 - NOISE_EMA ** self.counts).clamp_min(1e-300)
            smoothed = self.ema / weight
        else:
            smoothed = self._smooth(self.history)
        have &= torch.isfinite(smoothed).all(dim=0)
        smoothed = torch.where(have, smoothed, torch.zeros_like(smoothed))
        return smoothed[0], smoothed[1], have

    def _smooth(self, history: torch.Tensor) -> torch.Tensor:
        """median, winsor: (window, 2, n) -> (2, n), NaN where a column has no value."""
        if self.estimator == "median":
            return history.nanquantile(0.5, dim=0)  # (the mean of the middle two of an even count)
        return _winsorized_mean(history)

    def log_spread(self) -> float | None:
        """The jackknife standard error of ln(tr(Sigma) / |G|^2), the stage's noise scale, over the window's
        measured steps (Note [noise gate]): each step left out in turn, the stage estimate recomputed from the
        rest. None for `ema` (no window) or fewer than MIN_JACKKNIFE steps in the window; inf when some
        leave-one-out estimate is not positive (the stage's noise scale is not resolved)."""
        if self.estimator == "ema":
            return None
        rows = [k for k in range(self.window) if bool(torch.isfinite(self.history[k]).any())]
        if len(rows) < MIN_JACKKNIFE:
            return None
        logs = []
        for k in rows:
            held = self.history.clone()
            held[k] = float("nan")
            smoothed = self._smooth(held)
            have = torch.isfinite(smoothed).all(dim=0)
            gsq, trace = (float(v[have].sum()) for v in smoothed)
            if not (gsq > 0 and trace > 0):
                return math.inf
            logs.append(math.log(trace / gsq))
        mean = sum(logs) / len(logs)
        return math.sqrt((len(logs) - 1) / len(logs) * sum((x - mean) ** 2 for x in logs))

    def leave_one_out(self, numel: torch.Tensor) -> tuple[tuple[float, float, float] | None,
                                                          dict[int, tuple[float, float, float]]]:
        """The jackknife's inputs for every quantity of the learning model (tfrun.freeze.controller Note [learning
        gate]): the stage's (|G|^2, tr(Sigma), sum of sqrt(n |G|^2)) summed over its tensors with an estimate (n:
        `numel`, each tensor's scalars; None when no tensor has one), and window slot -> the same sums with that
        slot's measured step left out, for every slot that holds a step (none for `ema`, which has no window)."""
        full = self._sums(*self.values(), numel)
        if self.estimator == "ema":
            return full, {}
        out = {}
        for k in range(self.window):
            if not bool(torch.isfinite(self.history[k]).any()):
                continue
            held = self.history.clone()
            held[k] = float("nan")
            smoothed = self._smooth(held)
            have = torch.isfinite(smoothed).all(dim=0)
            sums = self._sums(smoothed[0], smoothed[1], have, numel)
            if sums is not None:
                out[k] = sums
        return full, out

    @staticmethod
    def _sums(gsq: torch.Tensor, trace: torch.Tensor, have: torch.Tensor,
              numel: torch.Tensor) -> tuple[float, float, float] | None:
        if not bool(have.any()):
            return None
        gsq, trace = torch.where(have, gsq, 0.0), torch.where(have, trace, 0.0)
        update = torch.sqrt(numel.to(gsq.device) * gsq.clamp(min=0.0)) * have
        return float(gsq.sum()), float(trace.sum()), float(update.sum())

    def stage(self) -> tuple[float, float] | None:
        """The stage's (|G|^2, tr(Sigma)): sums over its tensors that have an estimate; None when none has."""
        gsq, trace, have = self.values()
        if not bool(have.any()):
            return None
        return float(gsq[have].sum()), float(trace[have].sum())

    def state_dict(self) -> dict:
        return {"estimator": self.estimator, "window": self.window, "counts": self.counts, "ema": self.ema,
                "history": self.history, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        """A resumed run's state; its window may have grown with --steps (the default window is capped by the
        run's measured steps): the newest measured steps are kept, in order."""
        assert state["estimator"] == self.estimator, "a resume keeps --noise-estimator (tfrun.records.provenance)"
        self.counts, self.ema, self.steps = state["counts"], state["ema"], int(state["steps"])
        old = state["history"]
        if old.shape[0] == self.window:
            self.history = old
            return
        order = [(self.steps - k) % old.shape[0] for k in range(min(old.shape[0], self.steps), 0, -1)]  # oldest first
        kept = old[order][-self.window:]
        self.history.fill_(float("nan"))
        for k in range(len(kept)):  # step self.steps - len(kept) + k sits at its slot of the new ring
            self.history[(self.steps - len(kept) + k) % self.window] = kept[k]


def _winsorized_mean(history: torch.Tensor) -> torch.Tensor:
    """(window, 2, n) -> (2, n): per column, the mean of the finite values after clipping each into the median
    +- MAD_CLIP x its median absolute deviation (NaN where a column has no value). Medians of even counts are the
    mean of the middle two, so two values are never clipped (nothing tells an outlier from two)."""
    med = history.nanquantile(0.5, dim=0, keepdim=True)
    mad = (history - med).abs().nanquantile(0.5, dim=0, keepdim=True)
    clipped = torch.maximum(torch.minimum(history, med + MAD_CLIP * mad), med - MAD_CLIP * mad)
    return clipped.nanmean(dim=0)

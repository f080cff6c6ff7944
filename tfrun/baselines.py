"""The freezing methods people already use, as baselines (METHOD.md section 6), on whole tensors.

Both freeze a tensor for every micro-batch of a step (as the originals freeze for whole iterations), in the
same executor, so their speed and their loss compare with TimelyFreeze's on equal terms. They also serve the
hybrids (`timely+apf`, `timely+autofreeze`): the plan decides how much each action freezes and the baseline's
signal decides which tensors (`preferred`, tfrun.freezing).

APF (Chen et al., ICDCS 2021), per tensor. Every `check_every` steps the tensor's update accumulated since the
last check, u, feeds two exponential moving averages (factor `ema`, 0.99 in the paper): of u and of |u|,
elementwise. Its effective perturbation is ||EMA(u)||_1 / ||EMA(|u|)||_1: near 1 while the updates keep one
direction, near 0 once they only oscillate. Below `threshold` (0.05) the tensor is stable: it freezes for its
freezing period (in checks), which then grows by one (additive increase); a tensor found unstable halves its
period (multiplicative decrease, at least 1). A frozen tensor thaws when its period ends and is checked again
from there (its averages resume where they stopped).

AutoFreeze (Liu et al., 2021), per layer (embedding, each block, the final norm and head), front to back.
Every `check_every` steps each layer's gradient norm is compared with the previous check's: the rate of
change |n - n_prev| / n_prev. The threshold is the `percentile` (50th) of the rates of the layers still
training; the longest run of layers right after the frozen front whose rates are below it freezes, for good.
Layers live on different ranks, so the norms are gathered and every rank takes the same decision.

Both are functions of the parameters' updates or gradients, which data-parallel replicas share, so replicas
agree. Their state (averages, periods, norms, the frozen front) is part of the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tfrun.freezing import Candidate

APF, AUTOFREEZE = "apf", "autofreeze"


@dataclass(frozen=True, kw_only=True, slots=True)
class APFConfig:
    """APF's settings (its paper's defaults where it states them)."""

    threshold: float = 0.05
    """Effective perturbation below which a tensor is stable."""
    ema: float = 0.99
    """Factor of the moving averages of the accumulated update and of its magnitude."""
    check_every: int = 10
    """Steps between stability checks (the paper checks every few rounds; ours is a choice)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AutoFreezeConfig:
    """AutoFreeze's settings."""

    percentile: float = 50.0
    """Layers whose gradient-norm change rate is below this percentile of the training layers' rates freeze."""
    check_every: int = 20
    """Steps between checks."""


def layer_of(name: str) -> str:
    """The AutoFreeze layer a parameter belongs to.

    >>> layer_of("layers.3.attn.wq.weight"), layer_of("embed.weight"), layer_of("norm.weight")
    ('layers.3', 'embed', 'head')
    """
    if name.startswith("layers."):
        return ".".join(name.split(".")[:2])
    return "embed" if name.startswith("embed") else "head"


def layer_key(layer: str) -> tuple[int, int]:
    """Front-to-back order of layers: embed, layers.0, layers.1, ..., head."""
    if layer == "embed":
        return (0, 0)
    if layer == "head":
        return (2, 0)
    return (1, int(layer.split(".")[1]))


class APFSignal:
    """APF on one rank's tensors (module docstring)."""

    def __init__(self, stage_candidates: dict[int, list[Candidate]], config: APFConfig = APFConfig()) -> None:
        self.config = config
        self.names = [(s, c.name) for s, cands in sorted(stage_candidates.items()) for c in cands]
        self.ema_u: dict[tuple[int, str], torch.Tensor] = {}
        self.ema_abs: dict[tuple[int, str], torch.Tensor] = {}
        self.accum: dict[tuple[int, str], torch.Tensor] = {}
        self.period = {k: 1 for k in self.names}
        """Freezing period in checks."""
        self.frozen_until = {k: 0 for k in self.names}
        """First step at which the tensor trains again (0: not frozen)."""
        self.perturbation: dict[tuple[int, str], float] = {}
        """Effective perturbation at the last check (for reports)."""
        self._before: dict[tuple[int, str], torch.Tensor] = {}

    def frozen(self, step: int, stage: int) -> set[str]:
        return {n for (s, n) in self.names if s == stage and self.frozen_until[(s, n)] > step}

    def preferred(self, step: int, stage: int) -> set[str]:
        """For the hybrid: the tensors APF considers stable now."""
        return self.frozen(step, stage)

    def before_optimizer(self, step: int, modules: dict[int, nn.Module]) -> None:
        for s, module in modules.items():
            params = dict(module.named_parameters())
            for key in self.names:
                if key[0] == s and self.frozen_until[key] <= step:
                    self._before[key] = params[key[1]].detach().clone()

    def after_optimizer(self, step: int, modules: dict[int, nn.Module]) -> None:
        for s, module in modules.items():
            params = dict(module.named_parameters())
            for key, before in list(self._before.items()):
                if key[0] == s:
                    delta = params[key[1]].detach() - before
                    self.accum[key] = self.accum[key] + delta if key in self.accum else delta
        self._before.clear()
        if (step + 1) % self.config.check_every == 0:
            self._check(step)

    def _check(self, step: int) -> None:
        a = self.config.ema
        for key in self.names:
            if self.frozen_until[key] > step + 1 or key not in self.accum:
                continue  # frozen through the next step, or no update since the last check
            u = self.accum.pop(key)
            self.ema_u[key] = a * self.ema_u[key] + (1 - a) * u if key in self.ema_u else (1 - a) * u
            self.ema_abs[key] = a * self.ema_abs[key] + (1 - a) * u.abs() if key in self.ema_abs else (1 - a) * u.abs()
            total = float(self.ema_abs[key].sum())
            p = float(self.ema_u[key].abs().sum()) / total if total > 0 else 0.0
            self.perturbation[key] = p
            if p < self.config.threshold:
                self.frozen_until[key] = step + 1 + self.period[key] * self.config.check_every
                self.period[key] += 1
            else:
                self.period[key] = max(1, self.period[key] // 2)

    def state_dict(self) -> dict:
        return {"ema_u": self.ema_u, "ema_abs": self.ema_abs, "accum": self.accum, "period": self.period,
                "frozen_until": self.frozen_until, "perturbation": self.perturbation}

    def load_state_dict(self, state: dict) -> None:
        for key in ("ema_u", "ema_abs", "accum", "period", "frozen_until", "perturbation"):
            setattr(self, key, dict(state[key]))


class AutoFreezeSignal:
    """AutoFreeze over the whole pipeline (module docstring); every rank holds the same decision."""

    def __init__(self, stage_candidates: dict[int, list[Candidate]], all_layers: list[str],
                 config: AutoFreezeConfig = AutoFreezeConfig()) -> None:
        self.config = config
        self.local = {(s, c.name): layer_of(c.name) for s, cands in stage_candidates.items() for c in cands}
        self.layers = sorted(set(all_layers), key=layer_key)
        """Every layer of the model, front to back."""
        self.frozen_front = 0
        """Layers frozen so far (a prefix of `layers`), for good."""
        self.prev: dict[str, float] = {}
        """Gradient norm per layer at the last check."""
        self.rates: dict[str, float] = {}

    def frozen(self, step: int, stage: int) -> set[str]:
        gone = set(self.layers[: self.frozen_front])
        return {n for (s, n), layer in self.local.items() if s == stage and layer in gone}

    def preferred(self, step: int, stage: int) -> set[str]:
        """For the hybrid: the layers AutoFreeze has frozen so far (in the hybrid it freezes nothing itself)."""
        return self.frozen(step, stage)

    def before_optimizer(self, step: int, modules: dict[int, nn.Module]) -> None:
        if (step + 1) % self.config.check_every:
            return
        squares: dict[str, float] = {}
        for s, module in modules.items():
            for name, p in module.named_parameters():
                layer = self.local.get((s, name))
                if layer is not None and p.grad is not None:
                    squares[layer] = squares.get(layer, 0.0) + float(p.grad.detach().double().square().sum())
        norms = _gather_dicts({k: math.sqrt(v) for k, v in squares.items()})
        self.decide(norms)

    def decide(self, norms: dict[str, float]) -> None:
        """One check with every layer's gradient norm (pure: the same on every rank)."""
        training = self.layers[self.frozen_front:]
        self.rates = {layer: abs(norms[layer] - self.prev[layer]) / self.prev[layer] for layer in training
                      if layer in norms and self.prev.get(layer, 0.0) > 0}
        self.prev.update(norms)
        if not self.rates:
            return
        threshold = _percentile(sorted(self.rates.values()), self.config.percentile)
        for layer in training:
            if layer not in self.rates or self.rates[layer] >= threshold:
                break
            self.frozen_front += 1

    def after_optimizer(self, step: int, modules: dict[int, nn.Module]) -> None:
        pass

    def state_dict(self) -> dict:
        return {"frozen_front": self.frozen_front, "prev": self.prev, "rates": self.rates}

    def load_state_dict(self, state: dict) -> None:
        self.frozen_front, self.prev, self.rates = state["frozen_front"], dict(state["prev"]), dict(state["rates"])


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile of sorted values.

    >>> _percentile([1.0, 2.0, 3.0, 4.0], 50.0)
    2.5
    """
    pos = (len(values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _gather_dicts(local: dict[str, float]) -> dict[str, float]:
    """Union of every rank's dict (layers live on one rank each); the local dict without a process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(local)
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return {k: v for part in parts for k, v in part.items()}


def signal_factory(config):
    """For a freeze mode that uses a baseline (apf, autofreeze, and the hybrids): a function of a rank's stage
    candidates that builds its signal; None for the other modes."""
    kind = config.freeze.removeprefix("timely+")
    if kind == APF:
        cfg = APFConfig(threshold=config.apf_threshold, ema=config.apf_ema, check_every=config.apf_check_every)
        return lambda stage_candidates: APFSignal(stage_candidates, cfg)
    if kind == AUTOFREEZE:
        from tfrun.models import build

        layers = sorted({layer_of(name) for s in range(config.num_stages) for name, _ in
                         build(config.model, s, config.num_stages, config.seed, device="meta").named_parameters()})
        cfg = AutoFreezeConfig(percentile=config.autofreeze_percentile, check_every=config.autofreeze_check_every)
        return lambda stage_candidates: AutoFreezeSignal(stage_candidates, layers, cfg)
    return None

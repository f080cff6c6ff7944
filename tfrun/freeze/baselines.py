"""The freezing methods people already use, as baselines (METHOD.md section 6), on whole tensors.

Both freeze a tensor for every micro-batch of a step (as the originals freeze for whole iterations), in the
same executor, so their speed and their loss compare with TimelyFreeze's on equal terms. They also serve the
hybrids (`timely+apf`, `timely+autofreeze`): the plan decides how much each action freezes and the baseline's
signal decides which tensors (`preferred`, tfrun.freeze.freezing).

APF (Chen et al., ICDCS 2021) decides per scalar; our executor skips whole tensors. Every `check_every`
steps each training tensor's update accumulated since the last check, u = (its value now) - (its value at the
last check: one snapshot per check, not per step), feeds two exponential moving averages (factor `ema`, 0.99
in the paper), elementwise: of u and of |u|. A scalar's effective perturbation is |EMA(u)| / EMA(|u|): near 1
while its updates keep one direction, near 0 once they only oscillate (a scalar that never moved counts as
0); below `threshold` (0.05) the scalar is stable.
Note [apf share]: the tensor is stable when the share of its stable scalars reaches `stable_share`; it then freezes for
its freezing period (in checks), which grows by one (additive increase); a tensor found unstable halves its period
(multiplicative decrease, at least 1). A frozen tensor does not move, so its snapshot stays valid; it thaws when its
period ends and is checked again from there (its averages resume where they stopped). The default `stable_share` is
measured in docs/results.md ("APF, per scalar"). In the hybrid (`timely+apf`) the statistic reads the updates the plan's
partial freezing left, which is what APF observes of any training (docs/design.md, "Baselines in the hybrids").

AutoFreeze (Liu et al., 2021), per layer (embedding, each block, the final norm and head), front to back.
Each layer's gradient is accumulated over the `check_every` steps between checks (as the published method
does: one step's gradient is mostly mini-batch noise), and at the check the norm of its mean is compared with
the previous check's: the rate of change |n - n_prev| / n_prev. The threshold is the `percentile` (50th) of
the rates of the layers still training; the longest run of layers right after the frozen front whose rates
are below it freezes, for good. Layers live on different ranks, so the norms are gathered and every rank
takes the same decision. In the hybrid (`timely+autofreeze`) a tensor frozen in some of a step's
micro-batches holds the sum over the others; its reading is scaled by M / (micro-batches that reached it),
an unbiased estimate of the full step's gradient (a tensor frozen in all of them gives no reading that step).

Both are functions of the parameters' updates or gradients, which data-parallel replicas share, so replicas
agree. Their state (averages, periods, norms, the frozen front) is part of the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tfrun.config.train_config import APF_STABLE_SHARE
from tfrun.freeze.candidates import Candidate

APF, AUTOFREEZE = "apf", "autofreeze"


@dataclass(frozen=True, kw_only=True, slots=True)
class APFConfig:
    """APF's settings (its paper's defaults where it states them)."""

    threshold: float = 0.05
    """Effective perturbation below which a scalar is stable."""
    ema: float = 0.99
    """Factor of the moving averages of the accumulated update and of its magnitude."""
    check_every: int = 10
    """Steps between stability checks (the paper checks every few rounds; ours is a choice)."""
    stable_share: float = APF_STABLE_SHARE
    """A tensor freezes when this share of its scalars is stable (Note [apf share])."""


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
        self.snapshot: dict[tuple[int, str], torch.Tensor] = {}
        """Each tensor's value at its last check (or the start): the update since is its value minus this."""
        self.period = {k: 1 for k in self.names}
        """Freezing period in checks."""
        self.frozen_until = {k: 0 for k in self.names}
        """First step at which the tensor trains again (0: not frozen)."""
        self.stable_share: dict[tuple[int, str], float] = {}
        """Share of the tensor's scalars that were stable at its last check (for reports)."""
        self.perturbation: dict[tuple[int, str], float] = {}
        """Median effective perturbation of the tensor's scalars at its last check (for reports)."""
        self.share_history: dict[tuple[int, str], list[list[float]]] = {}
        """(stage, name) -> [step, stable share] at each of its checks (freeze_stats.json, for the study)."""

    def frozen(self, step: int, stage: int) -> set[str]:
        return {n for (s, n) in self.names if s == stage and self.frozen_until[(s, n)] > step}

    def preferred(self, step: int, stage: int) -> set[str]:
        """For the hybrid: the tensors APF considers stable now."""
        return self.frozen(step, stage)

    def before_optimizer(self, step: int, modules: dict[int, nn.Module],
                         frozen_counts: dict[tuple[int, str], int] | None = None, rescaled: bool = False) -> None:
        """APF reads updates, not gradients: only the first interval's snapshots are taken here."""
        if not self.snapshot:  # the start of the first interval
            self._take_snapshots(modules, self.names)

    def after_optimizer(self, step: int, modules: dict[int, nn.Module]) -> None:
        if (step + 1) % self.config.check_every == 0:
            self._check(step, modules)

    def _take_snapshots(self, modules: dict[int, nn.Module], keys) -> None:
        params = {s: dict(m.named_parameters()) for s, m in modules.items()}
        for s, name in keys:
            self.snapshot[(s, name)] = params[s][name].detach().clone()

    def _check(self, step: int, modules: dict[int, nn.Module]) -> None:
        a = self.config.ema
        params = {s: dict(m.named_parameters()) for s, m in modules.items()}
        for key in self.names:
            if self.frozen_until[key] >= step + 1:
                continue  # frozen through this whole interval (periods end at checks): no update, nothing to decide
            value = params[key[0]][key[1]].detach()
            u = (value - self.snapshot[key]).float()
            self.ema_u[key] = a * self.ema_u[key] + (1 - a) * u if key in self.ema_u else (1 - a) * u
            self.ema_abs[key] = a * self.ema_abs[key] + (1 - a) * u.abs() if key in self.ema_abs else (1 - a) * u.abs()
            # a scalar that never moved has perturbation 0 (0 / 0): it is as stable as a scalar can be
            p = self.ema_u[key].abs() / self.ema_abs[key].clamp_min(torch.finfo(torch.float32).tiny)
            share = float((p < self.config.threshold).float().mean())
            self.stable_share[key], self.perturbation[key] = share, float(p.median())
            self.share_history.setdefault(key, []).append([step, share])
            if share >= self.config.stable_share:
                self.frozen_until[key] = step + 1 + self.period[key] * self.config.check_every
                self.period[key] += 1
            else:
                self.period[key] = max(1, self.period[key] // 2)
            self.snapshot[key] = value.clone()

    def row(self, stage: int, name: str) -> dict:
        """freeze_stats.json's APF columns of one tensor."""
        key = (stage, name)
        return {"apf_stable_share": self.stable_share.get(key), "apf_median_perturbation": self.perturbation.get(key),
                "apf_period": self.period[key], "apf_stable_share_history": self.share_history.get(key, [])}

    def state_dict(self) -> dict:
        return {"ema_u": self.ema_u, "ema_abs": self.ema_abs, "snapshot": self.snapshot, "period": self.period,
                "frozen_until": self.frozen_until, "perturbation": self.perturbation,
                "stable_share": self.stable_share, "share_history": self.share_history}

    def load_state_dict(self, state: dict) -> None:
        """Also a checkpoint of the per-tensor APF of before (no snapshots: they are taken again at the next
        step, so the interval in progress restarts there)."""
        for key in ("ema_u", "ema_abs", "snapshot", "period", "frozen_until", "perturbation", "stable_share",
                    "share_history"):
            setattr(self, key, dict(state.get(key, {})))


class AutoFreezeSignal:
    """AutoFreeze over the whole pipeline (module docstring); every rank holds the same decision."""

    def __init__(self, stage_candidates: dict[int, list[Candidate]], all_layers: list[str],
                 config: AutoFreezeConfig = AutoFreezeConfig(), num_microbatches: int = 1) -> None:
        self.config = config
        self.num_microbatches = num_microbatches
        self.local = {(s, c.name): layer_of(c.name) for s, cands in stage_candidates.items() for c in cands}
        self.layers = sorted(set(all_layers), key=layer_key)
        """Every layer of the model, front to back."""
        self.frozen_front = 0
        """Layers frozen so far (a prefix of `layers`), for good."""
        self.prev: dict[str, float] = {}
        """Norm of each layer's mean gradient over the last interval."""
        self.rates: dict[str, float] = {}
        self.accum: dict[tuple[int, str], torch.Tensor] = {}
        """(stage, name) -> its gradient summed over the interval's steps that read it."""
        self.readings: dict[tuple[int, str], int] = {}
        """(stage, name) -> steps of the interval that read it."""

    def frozen(self, step: int, stage: int) -> set[str]:
        gone = set(self.layers[: self.frozen_front])
        return {n for (s, n), layer in self.local.items() if s == stage and layer in gone}

    def preferred(self, step: int, stage: int) -> set[str]:
        """For the hybrid: the layers AutoFreeze has frozen so far (in the hybrid it freezes nothing itself)."""
        return self.frozen(step, stage)

    def before_optimizer(self, step: int, modules: dict[int, nn.Module],
                         frozen_counts: dict[tuple[int, str], int] | None = None, rescaled: bool = False) -> None:
        """Add this step's gradients to the interval's (module docstring: a tensor frozen in some micro-batches,
        in the hybrid, counts M / unfrozen times its partial sum unless --grad-rescale did so already); at the
        interval's end, decide."""
        gone = set(self.layers[: self.frozen_front])
        m = self.num_microbatches
        for s, module in modules.items():
            for name, p in module.named_parameters():
                layer = self.local.get((s, name))
                if layer is None or layer in gone or p.grad is None:
                    continue
                frozen = (frozen_counts or {}).get((s, name), 0)
                g = p.grad.detach().float()
                if 0 < frozen < m and not rescaled:
                    g = g * (m / (m - frozen))
                key = (s, name)
                if key in self.accum:
                    self.accum[key] += g
                else:
                    self.accum[key] = g.clone()
                self.readings[key] = self.readings.get(key, 0) + 1
        if (step + 1) % self.config.check_every:
            return
        squares: dict[str, float] = {}
        for key, total in self.accum.items():
            mean = total.double() / self.readings[key]
            squares[self.local[key]] = squares.get(self.local[key], 0.0) + float(mean.square().sum())
        self.accum.clear()
        self.readings.clear()
        self.decide(_gather_dicts({k: math.sqrt(v) for k, v in squares.items()}))

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

    def row(self, stage: int, name: str) -> dict:
        """freeze_stats.json's AutoFreeze columns of one tensor."""
        layer = self.local[(stage, name)]
        return {"autofreeze_layer": layer, "autofreeze_rate": self.rates.get(layer)}

    def state_dict(self) -> dict:
        return {"frozen_front": self.frozen_front, "prev": self.prev, "rates": self.rates, "accum": self.accum,
                "readings": self.readings}

    def load_state_dict(self, state: dict) -> None:
        self.frozen_front, self.prev, self.rates = state["frozen_front"], dict(state["prev"]), dict(state["rates"])
        self.accum, self.readings = dict(state.get("accum", {})), dict(state.get("readings", {}))


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
        cfg = APFConfig(threshold=config.apf_threshold, ema=config.apf_ema, check_every=config.apf_check_every,
                        stable_share=config.apf_stable_share)
        return lambda stage_candidates: APFSignal(stage_candidates, cfg)
    if kind == AUTOFREEZE:
        from tfrun.models import build

        layers = sorted({layer_of(name) for s in range(config.num_stages) for name, _ in
                         build(config.model, s, config.num_stages, config.seed, device="meta").named_parameters()})
        cfg = AutoFreezeConfig(percentile=config.autofreeze_percentile, check_every=config.autofreeze_check_every)
        return lambda stage_candidates: AutoFreezeSignal(stage_candidates, layers, cfg, config.num_microbatches)
    return None

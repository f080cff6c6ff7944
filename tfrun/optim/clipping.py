"""The gradient norm of the whole model, over every stage and replica, from one all-reduce a step; its clipping;
and whether a step is finite.

Note [global clipping]: each rank holds the gradients of its stages; after the data-parallel reduction every
replica holds the same ones. The norm of the model's gradient is the square root of the sum, over the pipeline's
stages, of each stage's sum of squares (float64): replica 0's ranks contribute theirs to one all-reduce over
every rank, the other replicas 0, so every rank learns the same norm and the replicas agree to the bit. The
same all-reduce carries, per stage, whether its gradient is finite and, per last-stage rank, whether its
losses are: a step is judged by every rank alike (Note [non-finite steps] in tfrun.train). Clipping scales
every gradient by max_norm / (norm + 1e-6) when that is below 1, as torch.nn.utils.clip_grad_norm_ does on one
process. It sees the gradients the step computed: a frozen micro-batch contributed nothing to the tensors it
froze (after --grad-rescale, which tfrun.train applies first so that clipping bounds the update the optimizer
takes). Measured cost: docs/benchmarks.md, "The executor's own cost".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True, slots=True)
class StepNorm:
    """What one step's all-reduce told every rank."""

    norm: float
    """L2 norm of the model's gradient before clipping (nan or inf when a gradient is not finite)."""
    bad_grad_stages: tuple[int, ...]
    """Stages whose gradient is not finite."""
    bad_loss_stages: tuple[int, ...]
    """Last stages whose loss this step is not finite (one per pipeline; replicas' counted once)."""

    @property
    def finite(self) -> bool:
        return math.isfinite(self.norm) and not self.bad_grad_stages and not self.bad_loss_stages


def _sum_squares(params: Iterable[nn.Parameter], device: torch.device) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().double().square().sum()
    return total


def step_norm(stage_params: Mapping[int, list[nn.Parameter]], num_stages: int, *, losses_finite: bool | None,
              counts: bool, device: torch.device, group=None) -> StepNorm:
    """The model's gradient norm and the step's finiteness, on every rank of `group` (Note [global clipping]).

    Args:
        stage_params: this rank's stages -> their trainable parameters.
        num_stages: the pipeline's stage count.
        losses_finite: on a rank holding the last stage, whether all its micro-batch losses were finite;
            None elsewhere.
        counts: whether this rank's sums enter the norm (replica 0's ranks; every rank without replicas).
        group: the process group spanning the pipeline (and its replicas); None for the default one.
    Collective over `group`: one all-reduce of 2 + 2 S float64 values.
    """
    v = torch.zeros(2 + 2 * num_stages, dtype=torch.float64, device=device)
    for s, params in stage_params.items():
        sq = _sum_squares(params, device)
        if counts:
            v[0] += sq
        if not bool(torch.isfinite(sq)):
            v[2 + s] = 1.0
    if losses_finite is False and counts:
        v[2 + num_stages + num_stages - 1] = 1.0
    if dist.is_initialized():
        dist.all_reduce(v, group=group)
    flags = v[2:].tolist()
    return StepNorm(norm=math.sqrt(v[0].item()) if v[0].item() >= 0 else float("nan"),
                    bad_grad_stages=tuple(s for s in range(num_stages) if flags[s] > 0),
                    bad_loss_stages=tuple(s for s in range(num_stages) if flags[num_stages + s] > 0))


def clip_(params: Iterable[nn.Parameter], norm: float, max_norm: float) -> float:
    """Scale the gradients of `params` so that a model whose gradient norm is `norm` has at most max_norm;
    returns the factor (1.0 when no clipping was needed, as torch's clip_grad_norm_ clamps it)."""
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return coef


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float, group=None) -> float:
    """For a training loop of your own (docs/library.md): clip the gradient of a model whose parameters are split
    over the ranks of `group` (each rank passes its own, e.g. its pipeline stages') to a global L2 norm of at
    most max_norm; returns the norm before clipping (every rank the same). max_norm <= 0 only measures.
    With data-parallel replicas, pass the group of one replica's ranks (the replicas hold the same reduced
    gradients). Collective over `group` (None: every rank): one all-reduce of a float64 scalar."""
    params = [p for p in params if p.grad is not None]
    device = params[0].grad.device if params else torch.device("cpu")
    sq = _sum_squares(params, device)
    if dist.is_initialized():
        dist.all_reduce(sq, group=group)
    norm = math.sqrt(sq.item()) if sq.item() >= 0 else float("nan")
    if max_norm > 0 and math.isfinite(norm):
        clip_(params, norm, max_norm)
    return norm

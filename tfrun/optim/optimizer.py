"""AdamW as every trainer users know sets it up: weight decay on matrices and embeddings (tensors of two or
more dimensions), never on norms' scales or biases (nanoGPT, torchtitan, Hugging Face's Trainer do the same).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def param_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict]:
    """The optimizer's parameter groups: one group (as before weight decay was settable, so that older
    checkpoints' optimizer states still load) when weight_decay is 0, else decayed (ndim >= 2) and not."""
    params = [p for p in params if p.requires_grad]
    if weight_decay == 0.0:
        return [{"params": params, "weight_decay": 0.0}]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0})
            if g["params"]]


def adamw(params: Iterable[nn.Parameter], *, lr: float, weight_decay: float = 0.0,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over `params` (a stage's, in registration order) with decay on tensors of two or more dimensions."""
    return torch.optim.AdamW(param_groups(params, weight_decay), lr=lr, betas=betas, eps=eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The learning rate of the coming step, in every group."""
    for group in optimizer.param_groups:
        group["lr"] = lr

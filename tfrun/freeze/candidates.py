"""A stage's freezable tensors (candidates) and what each costs and learns.

Note [freeze share]: a ratio r means "skip about r of this stage's weight-gradient work". A tensor's cost is
its weight-gradient FLOPs per token (tfrun.freeze.candidates.grad_cost): 2 x in x out for a matmul weight, the row
width for an embedding (its gradient is an index-add of one row per token, not a matmul), 2 x elements for
a norm scale. Element counts would make LLaMA-3.2-1B's embedding 52% of stage 0's "cost" although freezing
it saves almost nothing. Shares and realised ratios are reported in this unit.

Parameters with requires_grad=False at construction are never candidates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One trainable parameter tensor of a stage."""

    name: str
    """Name in the stage module (`layers.3.mlp.w1.weight`)."""
    cost: float
    """Weight-gradient FLOPs per token (Note [freeze share])."""
    numel: int = 0
    """Elements."""


def grad_cost(owner: nn.Module, param_name: str, numel: int) -> float:
    """Weight-gradient FLOPs per token of one parameter of module `owner` (Note [freeze share]).

    >>> grad_cost(nn.Linear(4, 3), "weight", 12), grad_cost(nn.Embedding(100, 8), "weight", 800)
    (24.0, 8.0)
    """
    if isinstance(owner, nn.Linear):
        return 2.0 * numel if param_name == "weight" else float(numel)
    if isinstance(owner, nn.Embedding):
        return float(owner.embedding_dim)
    return 2.0 * numel


def candidates(module: nn.Module) -> list[Candidate]:
    """Trainable parameters of a stage in forward (registration) order, shared tensors once (their cost summed
    over the modules that use them)."""
    cost: dict[int, float] = {}
    for owner in module.modules():
        for pname, p in owner.named_parameters(recurse=False):
            cost[id(p)] = cost.get(id(p), 0.0) + grad_cost(owner, pname, p.numel())
    seen: set[int] = set()
    out = []
    for name, p in module.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(Candidate(name=name, cost=cost[id(p)], numel=p.numel()))
    return out


def goodput_priority(cands: list[Candidate], estimates: Mapping[str, tuple[float, float]],
                     batch_tokens: float) -> list[float] | None:
    """Learning per unit of weight-gradient cost of each tensor (Note [goodput order] in tfrun.freeze.allocate): the
    progress its first frozen micro-batches cost, g B N / (B + N)^2 with g its |G|^2 and N = tr(Sigma) / g its
    noise scale (tfplan.cost.goodput Note [goodput model]: d/dr of g e((1 - r) B) at r = 0), i.e.
    B tr(Sigma) / (B + N)^2, per unit of cost. A tensor with no positive |G|^2 estimate carries no signal: 0.
    None when no tensor has an estimate yet.

    >>> goodput_priority([Candidate(name="a", cost=1.0), Candidate(name="b", cost=2.0)],
    ...                  {"a": (1.0, 100.0), "b": (-1.0, 5.0)}, 100.0)
    [0.25, 0.0]
    """
    if not estimates:
        return None
    out = []
    for c in cands:
        gsq, trace = estimates.get(c.name, (0.0, 0.0))
        if gsq <= 0 or c.cost <= 0:
            out.append(0.0)
            continue
        noise = max(trace, 0.0) / gsq
        out.append(batch_tokens * max(trace, 0.0) / (batch_tokens + noise) ** 2 / c.cost)
    return out

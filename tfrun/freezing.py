"""Which parameters a (stage, micro-batch) action freezes, given the plan's freeze ratio.

Note [freeze share]: a ratio r means "skip about r of this stage's weight-gradient work". We weigh each
trainable parameter tensor by its element count (for a matmul weight, its weight-gradient FLOPs are
2 x tokens x elements; norm scales are tiny either way), never by tensor count, and pick the subset whose
share of the total is closest to r (the realised share is reported; it differs from r by at most half the
largest tensor's share).

Note [freeze policy]: on a stage that receives activations from an earlier stage the input-gradient chain
runs whatever we freeze, so a random subset is as good as any and keeps every tensor's chance of being
frozen equal (re-drawn every `redraw_every` steps from a generator seeded by (seed, redraw index, stage,
micro-batch), so data-parallel replicas draw the same set). Stage 0 needs no input gradient: freezing a
contiguous *prefix* of its parameters (in forward order: embedding, block 0, block 1, ...) also prunes the
whole backward below the first unfrozen tensor, so its backward time falls from B to 0 roughly linearly in
r, as the LP assumes (benchmarks/freeze_linearity.py measures it).

Parameters with requires_grad=False at construction are never candidates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

PREFIX, RANDOM, AUTO = "prefix", "random", "auto"


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One trainable parameter tensor of a stage."""

    name: str
    """Name in the stage module (`layers.3.mlp.w1.weight`)."""
    cost: float
    """Weight-gradient cost weight: element count."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """The parameters one action freezes."""

    names: frozenset[str]
    """Frozen parameter names."""
    share: float
    """Realised frozen share of the stage's weight-gradient cost, in [0, 1]."""


def candidates(module: nn.Module) -> list[Candidate]:
    """Trainable parameters of a stage in forward (registration) order, shared tensors once."""
    seen: set[int] = set()
    out = []
    for name, p in module.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(Candidate(name=name, cost=float(p.numel())))
    return out


def closest_prefix(items: Sequence[Candidate], ratio: float) -> Selection:
    """The prefix of `items` whose cost share is closest to `ratio` (ties: the shorter prefix).

    >>> c = [Candidate(name=n, cost=w) for n, w in (("a", 1.0), ("b", 1.0), ("c", 2.0))]
    >>> sorted(closest_prefix(c, 0.5).names)
    ['a', 'b']
    """
    total = sum(c.cost for c in items)
    if total <= 0 or ratio <= 0:
        return Selection(names=frozenset(), share=0.0)
    best_k, best_gap, acc = 0, ratio, 0.0
    for k, c in enumerate(items, start=1):
        acc += c.cost
        gap = abs(acc / total - ratio)
        if gap < best_gap - 1e-12:
            best_k, best_gap = k, gap
    chosen = items[:best_k]
    return Selection(names=frozenset(c.name for c in chosen), share=sum(c.cost for c in chosen) / total)


class Freezer:
    """Per-(stage, micro-batch) frozen parameter sets for one rank's stages.

    Args:
        stage_candidates: stage index -> its candidates (from `candidates`).
        ratios: (stage, micro-batch) -> planned freeze ratio of that micro-batch's B or W action.
        seed: selection seed (the same on every data-parallel replica).
        redraw_every: steps between random re-draws (>= 1).
        ramp_steps: ratios ramp linearly from 0 to the plan over this many steps (0 = from the first step).
        policy: auto (Note [freeze policy]), or prefix / random on every stage (for measurements).
    """

    def __init__(
        self,
        stage_candidates: dict[int, list[Candidate]],
        ratios: dict[tuple[int, int], float],
        *,
        seed: int,
        redraw_every: int = 10,
        ramp_steps: int = 0,
        policy: str = AUTO,
    ) -> None:
        assert redraw_every >= 1 and ramp_steps >= 0 and policy in (AUTO, PREFIX, RANDOM)
        self._policy = policy
        self.stage_candidates = stage_candidates
        self.ratios = ratios
        self.seed = seed
        self.redraw_every = redraw_every
        self.ramp_steps = ramp_steps
        self._cache: dict[tuple[int, int], Selection] = {}
        self._cache_key: tuple[int, float] | None = None

    def policy(self, stage: int) -> str:
        """Note [freeze policy]."""
        if self._policy != AUTO:
            return self._policy
        return PREFIX if stage == 0 else RANDOM

    def ramp(self, step: int) -> float:
        """Fraction of the planned ratios applied at `step` (0-based)."""
        if self.ramp_steps == 0:
            return 1.0
        return min(1.0, (step + 1) / self.ramp_steps)

    def selection(self, step: int, stage: int, mb: int) -> Selection:
        """The parameters frozen in stage `stage`'s micro-batch `mb` at training step `step`."""
        key = (step // self.redraw_every, self.ramp(step))
        if key != self._cache_key:
            self._cache.clear()
            self._cache_key = key
        cached = self._cache.get((stage, mb))
        if cached is not None:
            return cached
        ratio = self.ratios.get((stage, mb), 0.0) * key[1]
        items = self.stage_candidates[stage]
        if self.policy(stage) == RANDOM and ratio > 0:
            rng = random.Random(f"{self.seed}/{key[0]}/{stage}/{mb}")  # str seeds hash deterministically
            items = rng.sample(items, len(items))
        chosen = closest_prefix(items, ratio)
        self._cache[(stage, mb)] = chosen
        return chosen

    def state_dict(self) -> dict:
        """Selection depends only on (seed, step, stage, mb): the seed is the whole RNG state."""
        return {"seed": self.seed, "redraw_every": self.redraw_every, "ramp_steps": self.ramp_steps,
                "policy": self._policy}

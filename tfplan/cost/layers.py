"""A per-layer profile split into the schedule's stages: contiguous groups of layers, balanced by time or given.

The layers are tfplan.cost.profile.StageCost records; each stage is their sum (Note [layer partition]).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tfplan.errors import TfplanError


def check_split(counts: Sequence[int], num_stages: int, num_layers: int) -> list[int]:
    if len(counts) != num_stages:
        raise TfplanError(f"--layers-per-stage gives {len(counts)} stages but the schedule has {num_stages}")
    if any(c < 1 for c in counts) or sum(counts) != num_layers:
        raise TfplanError(f"--layers-per-stage must be positive and sum to the {num_layers} layers, got {list(counts)}")
    return list(counts)


def balanced_split(weights: Sequence[float], parts: int) -> list[int]:
    """Contiguous split of `weights` into `parts` non-empty groups minimising the largest group sum.

    >>> balanced_split([1, 1, 1, 1, 4], 2)
    [4, 1]
    """
    n = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # best[k][i]: smallest possible max-group-sum splitting the first i layers into k groups.
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = value, j
    counts, i = [], n
    for k in range(parts, 0, -1):
        counts.append(i - cut[k][i])
        i = cut[k][i]
    return counts[::-1]


def partition_layers(layers: Sequence, num_stages: int, counts: Sequence[int] | None = None) -> tuple:
    """Sum contiguous layers (tfplan.cost.profile.StageCost records) into stages of the same type.

    Note [layer partition]: balanced by forward + backward time. The first stage needs no input gradient,
    so its fully frozen backward and its I step are 0 and its W step is the whole backward (as torch runs it).
    """
    if len(layers) < num_stages:
        raise TfplanError(f"profile has {len(layers)} layers, fewer than the {num_stages} stages asked for")
    if counts is None:
        counts = balanced_split([c.forward_ms + c.backward_ms for c in layers], num_stages)
    stages, start = [], 0
    for s, count in enumerate(counts):
        group = layers[start : start + count]
        start += count
        times = [f.name for f in dataclasses.fields(group[0]) if f.name != "name"]  # every field but the label
        total = {f: math.fsum(getattr(c, f) for c in group) for f in times}
        if s == 0:
            total |= {
                "backward_frozen_ms": 0.0,
                "backward_input_ms": 0.0,
                "backward_weight_ms": total["backward_ms"],
                "backward_weight_frozen_ms": 0.0,
            }
        label = f"{group[0].name}..{group[-1].name}" if group[0].name else f"layers {start - count}..{start - 1}"
        stages.append(dataclasses.replace(group[0], name=label, **total))
    return tuple(stages)

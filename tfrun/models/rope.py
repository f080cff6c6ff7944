"""Rotary position embeddings: the angle tables (with LLaMA 3's and linear frequency scaling) and the rotation.

Angle of position p and feature pair i is p * f_i radians with f_i = theta^(-2i / head_dim); a scaling rewrites
the frequencies f_i once, so the tables cover every position up to max_seq_len and cost nothing per step.
Pairs are (i, i + head_dim / 2) ("rotate half"), the layout of Hugging Face's LLaMA checkpoints, so their
weights load without permutation (tfrun.models.hf).

    >>> cos, sin = rope_tables(8, 4, 10000.0)
    >>> tuple(cos.shape), float(cos[0, 0]), round(float(sin[1, 0]), 4)
    ((4, 4), 1.0, 0.8415)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tfrun.errors import TfrunError

ROPE_KINDS = ("linear", "llama3")
"""Frequency scalings we implement (a Hugging Face config's rope_type); others are refused by name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RopeScaling:
    """How the rotary frequencies are rescaled for contexts longer than pre-training (Hugging Face's
    rope_scaling / rope_parameters)."""

    kind: str
    """"linear" (every frequency / factor) or "llama3" (low frequencies / factor, high ones kept, a smooth
    blend between: Note [llama3 rope])."""
    factor: float
    """Context extension factor (dimensionless, > 0)."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_seq_len / low_freq_factor are fully scaled."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_seq_len / high_freq_factor are kept."""
    original_max_seq_len: int = 8192
    """llama3: the pre-training context, in tokens."""

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise TfrunError(f"rope_scaling.rope_type {self.kind!r} is not supported (supported: "
                             f"{', '.join(ROPE_KINDS)})")
        if not self.factor > 0 or self.original_max_seq_len < 1:
            raise TfrunError(f"rope_scaling: factor must be > 0 and original_max_position_embeddings >= 1, got "
                             f"{self.factor}, {self.original_max_seq_len}")
        if self.kind == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise TfrunError(f"rope_scaling: need 0 < low_freq_factor < high_freq_factor, got "
                             f"{self.low_freq_factor}, {self.high_freq_factor}")


# Note [llama3 rope]: LLaMA 3.1 stretches its 8K pre-training context to 128K by dividing only the low
# frequencies (wavelength above original / low_freq_factor) by `factor`; high frequencies (wavelength below
# original / high_freq_factor) keep their value, and those between are blended linearly in original /
# wavelength. This is Meta's reference `apply_scaling` and Hugging Face's "llama3" rope_type.
#
# Note [rope precision]: the tables are computed in float32, in the order of operations Hugging Face's LLaMA
# uses, so that a checkpoint trained there sees exactly the angles it was trained with: our logits then equal
# transformers' to the last bit (tests/tfrun/models/test_hf.py). float64 tables differ by about 1e-7 in cos and sin,
# enough to move logits of size 10 by 2e-5.
def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """f_i for i < head_dim / 2, float32, after the scaling (Notes [llama3 rope], [rope precision])."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    old, low, high = scaling.original_max_seq_len, scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / scaling.factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, blended, scaled)


def rope_tables(head_dim: int, max_seq_len: int, theta: float,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (max_seq_len, head_dim / 2) float32 on the default device
    (Note [rope precision])."""
    angles = torch.outer(torch.arange(max_seq_len).float(), inverse_frequencies(head_dim, theta, scaling))
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate feature pairs (i, i + hd/2) of x (B, T, heads, hd) by the angles in cos/sin (T, hd/2).

    This "rotate half" layout differs from Meta's interleaved pairs by a fixed permutation of the head
    features, which Hugging Face's checkpoints already carry in their q and k projections.
    """
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]  # broadcast over batch and heads
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)

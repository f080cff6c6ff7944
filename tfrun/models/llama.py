"""A LLaMA-style decoder built one pipeline stage at a time: tokens -> hidden -> ... -> hidden -> logits.

The file reads top to bottom (the shape and named sizes are tfrun.models.shape's): how layers are split over
stages, the components (RMSNorm, grouped-query attention with rotary embeddings from tfrun.models.rope, SwiGLU
MLP, pre-norm block), the stage module with its deterministic initialisation, `build_stage`, and the loss.

Only the requested stage's parameters are ever created. Each layer draws its initial values from its own
generator seeded by (seed, global layer index), so stage s of an S-stage split holds exactly the values of the
same layers in a 1-stage model; the executor's tests compare a pipeline against that single-process reference.

Time the CPU sizes (one compute thread, as every pipeline rank runs):
    python -m tfrun.models
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from tfrun.models.rope import apply_rope, rope_tables
from tfrun.models.shape import MODELS, ModelConfig, ModelError

__all__ = ["MODELS", "ModelConfig", "ModelError", "TransformerStage", "build_stage", "count_params", "loss_fn",
           "masked_loss", "split_layers"]


# Note [layer split]: stages are balanced by layer count. When n_layers % num_stages != 0 the extra layers go
# to the middle stages first, then to the first stage, never to the last: the last stage also runs the final
# norm and LM head, which for a 128K vocabulary costs about as much as two or three blocks, while the
# embedding lookup on the first stage is nearly free (there are at most num_stages - 1 extra layers).
def split_layers(n_layers: int, num_stages: int) -> list[int]:
    """Number of transformer blocks on each stage, first to last.

    Args:
        n_layers: blocks in the whole model.
        num_stages: pipeline stages; every stage gets at least one block.
    Returns:
        Block counts per stage, summing to n_layers. See Note [layer split].
    Raises:
        ModelError: num_stages < 1 or more stages than blocks.

    >>> split_layers(8, 3), split_layers(7, 3), split_layers(5, 2)
    ([3, 3, 2], [2, 3, 2], [3, 2])
    """
    if num_stages < 1:
        raise ModelError(f"num_stages: must be >= 1, got {num_stages}")
    if n_layers < num_stages:
        raise ModelError(f"num_stages: {num_stages} stages need as many layers, the model has {n_layers}")
    counts = [n_layers // num_stages] * num_stages
    for stage in [*range(1, num_stages - 1), 0][: n_layers % num_stages]:
        counts[stage] += 1
    return counts


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension; (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 so that low-precision activations do not lose the mean square.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads; (B, T, dim) -> (B, T, dim) through n_heads x head_dim
    features; optional biases and per-head query/key norms (Note [families])."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=cfg.out_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:  # over each head's features, before the rotation (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        # GQA: query head h reads kv head h // rep, so repeat each kv head rep times -> (B, T, n_heads, hd).
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        # SDPA takes (B, heads, T, hd); is_causal masks future positions.
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, n_heads, T, hd)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward: w2(silu(w1 x) * w3 x); (B, T, dim) -> (B, T, dim) through ffn_dim features."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=cfg.mlp_bias)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=cfg.mlp_bias)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=cfg.mlp_bias)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: h + attn(norm(h)), then h + mlp(norm(h)); (B, T, dim) -> (B, T, dim)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.attn_norm(h), cos, sin)
        return h + self.mlp(self.mlp_norm(h))


# Weights are N(0, INIT_STD); the two projections that write into the residual stream (attn.wo, mlp.w2) are
# scaled down by sqrt(2 * n_layers) so the stream's variance does not grow with depth (GPT-2). Norm weights
# start at 1. The LM head uses INIT_STD too, so an untrained model predicts nearly uniformly (loss ~ ln V).
INIT_STD = 0.02
_RESIDUAL_OUT = ("attn.wo.weight", "mlp.w2.weight")


def _generator(seed: int, key: str, device: torch.device) -> torch.Generator:
    """A generator for one named part ("embed", "layer.3", "head") of the model, independent of the split."""
    digest = hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest, "little") >> 1)  # 63 bits: always a valid seed
    return gen


# Note [tied embeddings]: a tied head shares one tensor with the embedding. A 1-stage model holds one parameter
# (embed.weight, which the head reads). In a pipeline the embedding lives on the first stage and the head on the
# last, in different processes: each holds a copy, the head's starting as an exact copy of the embedding (the
# same generator, or the checkpoint's embedding), and tfrun.distributed.tied keeps the two one parameter (their
# gradients summed every step, stored once: Note [tied embeddings across stages] there).
class TransformerStage(nn.Module):
    """One pipeline stage: [embedding] -> blocks layer_ids -> [final norm -> LM head].

    Stage 0 maps token ids (B, T) int64 to hidden (B, T, dim); middle stages map hidden to hidden; the last
    stage returns logits (B, T, vocab_size) float32; a 1-stage model maps token ids to logits. Blocks are kept
    under their global index (`layers.5.attn.wq.weight`) so names and values do not depend on the split.
    """

    def __init__(self, cfg: ModelConfig, layer_ids: range, *, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.cfg, self.layer_ids, self.is_first, self.is_last = cfg, layer_ids, is_first, is_last
        self.tied = cfg.tie_embeddings and is_first and is_last  # Note [tied embeddings]
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim) if is_first else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in layer_ids})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps) if is_last else None
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False) if is_last else None
        self._tie()
        # Rotary tables shared by every block of the stage; recomputed rather than checkpointed.
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _tie(self) -> None:
        if self.tied:
            self.head.weight = self.embed.weight

    @torch.no_grad()
    def reset_rope(self) -> None:
        """Tie the head again (to_empty() may have replaced the shared tensor) and fill the rotary tables."""
        self._tie()
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, self.cfg.rope_scaling)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Fill every parameter and buffer from (seed, part name); see the module docstring.

        Values are exactly reproducible for a given device type (CPU and CUDA generators differ).
        """
        self.reset_rope()
        device = self.rope_cos.device
        if self.embed is not None:
            self.embed.weight.normal_(0.0, INIT_STD, generator=_generator(seed, "embed", device))
        out_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        for i, block in self.layers.items():
            gen = _generator(seed, f"layer.{i}", device)
            for name, p in block.named_parameters():  # registration order: fixed, so draws are too
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):  # (draws nothing: a model without biases draws as before)
                    p.zero_()
                else:
                    p.normal_(0.0, out_std if name in _RESIDUAL_OUT else INIT_STD, generator=gen)
        if self.norm is not None:
            self.norm.weight.fill_(1.0)
        if self.head is not None and not self.tied:
            # An untied split of a tied config starts the head as a copy of the embedding.
            key = "embed" if self.cfg.tie_embeddings else "head"
            self.head.weight.normal_(0.0, INIT_STD, generator=_generator(seed, key, device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x  # (B, T) int64 -> (B, T, dim)
        t = h.shape[1]
        if t > self.cfg.max_tokens:
            raise ModelError(f"sequence of {t} tokens exceeds the model's {self.cfg.max_tokens} (max_seq_len "
                             f"{self.cfg.max_seq_len}, sliding_window {self.cfg.sliding_window})")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        for block in self.layers.values():
            h = block(h, cos, sin)
        if self.head is None:
            return h
        return self.head(self.norm(h)).float()  # (B, T, vocab_size) float32


def build_stage(
    cfg: ModelConfig, stage_index: int, num_stages: int, seed: int, *, device: str | torch.device = "cpu"
) -> TransformerStage:
    """Create only stage `stage_index` of a `num_stages` split, initialised from `seed`.

    Args:
        cfg: model shape.
        stage_index: 0-based stage to build.
        num_stages: stages in the split (1 builds the whole model).
        seed: initialisation seed; equal seeds give equal values for every layer whatever the split.
        device: where parameters live. "meta" allocates nothing and skips initialisation (shapes only).
    Returns:
        The stage module, in train mode.
    Raises:
        ModelError: stage_index out of range or fewer layers than stages.
    """
    counts = split_layers(cfg.n_layers, num_stages)
    if not 0 <= stage_index < num_stages:
        raise ModelError(f"stage_index: must be in [0, {num_stages}), got {stage_index}")
    first = sum(counts[:stage_index])
    layer_ids = range(first, first + counts[stage_index])
    is_first, is_last = stage_index == 0, stage_index == num_stages - 1
    with torch.device("meta"):  # allocate once below: skips nn.Linear's own (wasted) init of big matrices
        stage = TransformerStage(cfg, layer_ids, is_first=is_first, is_last=is_last)
    if torch.device(device).type != "meta":
        stage.to_empty(device=device)
        stage.init_weights(seed)
    return stage


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats, float32; logits (B, T, V), targets (B, T) int64 -> scalar."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, counted_per_microbatch: float) -> torch.Tensor:
    """Next-token cross-entropy summed over the targets that count (targets of -100 do not) over the step's counted
    targets per micro-batch: a step's micro-batch losses, averaged as the schedule averages them, give the mean
    over every counted token of the step (not the mean of the micro-batches' means, which would weight a target
    by how few its micro-batch holds); float32 scalar."""
    total = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1), ignore_index=-100, reduction="sum")
    return total / counted_per_microbatch


def count_params(module: nn.Module) -> int:
    """Number of parameter elements, counting a shared (tied) tensor once."""
    return sum(p.numel() for p in module.parameters())

"""A model's shape: ModelConfig (sizes, rope, ties and the families' options) and the named sizes.

tfrun.models.llama builds stages of such a shape; tfrun.models.hf_config reads one from a Hugging Face config.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tfrun.errors import TfrunError
from tfrun.models.rope import RopeScaling


class ModelError(TfrunError):
    """A model configuration or stage request the user can fix (bad sizes, stage index out of range)."""


# Note [families]: the Hugging Face families tfrun reads (tfrun.models.hf_config) are one block with options, not
# a copy each: LLaMA (attention_bias puts biases on q, k, v and o; mlp_bias on the MLP), Qwen2 (biases on q, k
# and v only), Qwen3 (an RMSNorm over each head's queries and keys before the rotary embedding; heads wider than
# dim / n_heads; attention_bias as LLaMA's) and Mistral (a sliding window). A sliding window is refused for
# sequences longer than it rather than implemented: within its length it is inert, and fine-tuning sequences
# (2-8K tokens) sit within Mistral's 4,096 and Qwen's 32K windows. Biases start at 0 and the q/k norms at 1, so
# a model without them draws exactly the values it drew before they existed.
@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Shape of a LLaMA-style decoder. Parameters are float32; mixed precision is the trainer's business."""

    vocab_size: int
    """Number of token ids: rows of the embedding and columns of the logits."""
    dim: int
    """Width of the residual stream, in features."""
    n_layers: int
    """Number of transformer blocks in the whole model (all stages together)."""
    n_heads: int
    """Number of query heads per attention layer; head width is dim / n_heads features."""
    n_kv_heads: int
    """Number of key/value heads (grouped-query attention); must divide n_heads."""
    ffn_dim: int
    """Hidden width of the SwiGLU MLP, in features."""
    max_seq_len: int
    """Longest sequence the rotary tables cover, in tokens."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies (dimensionless); LLaMA 3 uses 500000."""
    rope_scaling: RopeScaling | None = None
    """Frequency scaling for long contexts (tfrun.models.rope); None: plain rotary frequencies."""
    norm_eps: float = 1e-5
    """Added to the mean square inside RMSNorm (dimensionless)."""
    tie_embeddings: bool = False
    """Share the embedding matrix with the LM head (Note [tied embeddings])."""
    # -- the options of the families (Note [families]) --
    attn_head_dim: int | None = None
    """Width of one attention head, in features; None: dim / n_heads (Qwen3's heads are wider than that)."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2; LLaMA's and Qwen3's attention_bias)."""
    out_bias: bool = False
    """A bias on the attention's output projection (LLaMA's and Qwen3's attention_bias)."""
    mlp_bias: bool = False
    """Biases on the MLP's three projections (LLaMA's mlp_bias)."""
    qk_norm: bool = False
    """RMSNorm over each head's queries and keys before the rotary embedding (Qwen3)."""
    sliding_window: int | None = None
    """Attention reaches back at most this many tokens (Mistral, Qwen2/3 with use_sliding_window): inert for
    sequences up to it, the only ones a run may use (tfrun.config.train_config.TrainConfig.check)."""
    family: str = "llama"
    """The Hugging Face model_type of the shape (llama, qwen2, qwen3, mistral): an export writes it back."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ModelError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.attn_head_dim is None and self.dim % self.n_heads:
            raise ModelError(f"dim: must be divisible by n_heads={self.n_heads}, got {self.dim}")
        if self.attn_head_dim is not None and self.attn_head_dim <= 0:
            raise ModelError(f"head_dim: must be > 0, got {self.attn_head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"n_kv_heads: must divide n_heads={self.n_heads}, got {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ModelError(f"head_dim: rotary embeddings need an even head width, got {self.head_dim}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ModelError(f"rope_theta and norm_eps: must be > 0, got {self.rope_theta}, {self.norm_eps}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ModelError(f"sliding_window: must be > 0, got {self.sliding_window}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head, in features."""
        return self.attn_head_dim if self.attn_head_dim is not None else self.dim // self.n_heads

    @property
    def max_tokens(self) -> int:
        """The longest sequence a run may use: the rotary tables' reach, and a sliding window's (within which it
        is inert)."""
        return min(self.max_seq_len, self.sliding_window or self.max_seq_len)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ModelConfig:
        """Inverse of to_dict; unknown or missing keys raise ModelError naming the key."""
        fields = dataclasses.fields(cls)
        for key in sorted(set(data) - {f.name for f in fields}):
            raise ModelError(f"model.{key}: unknown key")
        for f in fields:
            if f.name not in data and f.default is dataclasses.MISSING:
                raise ModelError(f"model.{f.name}: missing")
        scaling = data.get("rope_scaling")
        if isinstance(scaling, dict):
            data = {**data, "rope_scaling": RopeScaling(**scaling)}
        return cls(**data)  # type: ignore[arg-type]


# Named sizes. tiny/small use the byte vocabulary (256) of tfrun.data and are sized for CPU runs with a
# micro-batch of 4 sequences x 128 tokens and one compute thread per process (torch.set_num_threads(1)).
# `python -m tfrun.models` on the 2-core dev host (torch 2.13.0+cpu, median of 20), ms per micro-batch, for a
# 2-stage split; F forward, B full backward, I input-gradient-only backward (every weight frozen):
#   tiny  (1.25 M params per stage, 2 blocks each): stage 0 F 19, B 36;  stage 1 F 20, B 38, I 23
#   small (6.39 M params per stage, 4 blocks each): stage 0 F 87, B 167; stage 1 F 84, B 166, I 95
# A 30-step GPipe run of tiny with 8 micro-batches on 2 ranks then computes (8 + 1) * (20 + 38) ms = 0.5 s
# per step, about 16 s in all (about 1.5x that inside a gloo pipeline, see TORCH-NOTES); one activation
# message is 4 x 128 x 256 float32 = 512 KiB, well under a millisecond on loopback. tiny's ffn_dim is 2 * dim
# (not LLaMA's ~8/3 * dim) to keep it in that budget. The LLaMA shapes are the published ones; max_seq_len
# is their 8192-token pre-training context (the llama3 rope scaling for 128K contexts changes no shape).
MODELS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=256, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=512, max_seq_len=512
    ),
    "small": ModelConfig(
        vocab_size=256, dim=384, n_layers=8, n_heads=6, n_kv_heads=2, ffn_dim=1024, max_seq_len=1024
    ),
    "llama3.2-1b": ModelConfig(
        vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
        max_seq_len=8192, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=True,
    ),
    "llama3.1-8b": ModelConfig(
        vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
        max_seq_len=8192, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=False,
    ),
}

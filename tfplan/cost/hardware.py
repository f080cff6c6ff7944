"""The hardware and model catalogue of the analytic cost model: LLaMA shapes, GPUs and links, by name.

Every number is a published one (docs/cost-model.md gives each source); names are case- and
punctuation-insensitive and have aliases (e.g. "llama3-8b" for "llama3.1-8b"). A user's own model may be any
object with the shape's attributes (ours, Hugging Face's or torchtitan's names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfplan.errors import TfplanError


def _by_name(*items: Any) -> dict[str, Any]:
    return {item.name: item for item in items}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """Shape of a LLaMA-style decoder (pre-norm RMSNorm, GQA attention with rotary, SwiGLU MLP)."""

    name: str
    """Canonical name, e.g. 'llama3.1-8b'."""
    hidden_size: int
    """Model width d (elements)."""
    num_layers: int
    """Transformer blocks L."""
    num_heads: int
    """Query heads h; head_dim = hidden_size / num_heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention; equal to num_heads for plain multi-head attention)."""
    intermediate_size: int
    """SwiGLU hidden width f (elements)."""
    vocab_size: int
    """Vocabulary V (tokens)."""
    tie_embeddings: bool = False
    """Output head shares the embedding matrix (affects the parameter count only, Note [tied head])."""

    @property
    def head_dim(self) -> int:
        """Elements per attention head."""
        return self.hidden_size // self.num_heads


# Published configs (Hugging Face config.json of each meta-llama model; docs/cost-model.md).
MODELS: dict[str, ModelShape] = _by_name(
    ModelShape(
        name="llama3.2-1b",
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        tie_embeddings=True,
    ),
    ModelShape(
        name="llama3.2-3b",
        hidden_size=3072,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        tie_embeddings=True,
    ),
    ModelShape(
        name="llama3.1-8b",
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
    ),
    ModelShape(
        name="llama3.1-70b",
        hidden_size=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        intermediate_size=28672,
        vocab_size=128256,
    ),
)
_MODEL_ALIASES = {
    "llama3-1b": "llama3.2-1b",
    "llama3-3b": "llama3.2-3b",
    "llama3-8b": "llama3.1-8b",
    "llama3-70b": "llama3.1-70b",
}

# Attribute names accepted for a custom shape: ours, then Hugging Face's, then torchtitan-style ones.
_SHAPE_ATTRS = {
    "hidden_size": ("hidden_size", "dim", "d_model"),
    "vocab_size": ("vocab_size",),
    "num_layers": ("num_layers", "num_hidden_layers", "n_layers"),
    "num_heads": ("num_heads", "num_attention_heads", "n_heads"),
    "num_kv_heads": ("num_kv_heads", "num_key_value_heads", "n_kv_heads"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "ffn_hidden_size"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """Vendor datasheet figures of one GPU (dense, no sparsity)."""

    name: str
    """Canonical name, e.g. 'h100'."""
    peak_bf16_tflops: float
    """Peak dense bf16 tensor-core throughput (TFLOP/s, 1e12 FLOP/s)."""
    hbm_gb_per_s: float
    """Peak HBM bandwidth (GB/s, 1e9 bytes/s)."""
    links: tuple[str, str, str]
    """The LINKS names that 'nvlink', 'pcie' and 'ib' mean in this GPU's systems (its generation)."""


GPUS: dict[str, GpuSpec] = _by_name(
    GpuSpec(name="a100", peak_bf16_tflops=312.0, hbm_gb_per_s=2039.0, links=("nvlink3", "pcie4", "ib-hdr")),
    GpuSpec(name="h100", peak_bf16_tflops=989.0, hbm_gb_per_s=3350.0, links=("nvlink4", "pcie5", "ib-ndr")),
    GpuSpec(name="h200", peak_bf16_tflops=989.0, hbm_gb_per_s=4800.0, links=("nvlink4", "pcie5", "ib-ndr")),
)
_GPU_ALIASES = {
    "a100-80gb": "a100",
    "a100-sxm": "a100",
    "a100-sxm4": "a100",
    "a100-sxm4-80gb": "a100",
    "h100-sxm": "h100",
    "h100-sxm5": "h100",
    "h100-80gb": "h100",
    "h100-sxm5-80gb": "h100",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "h200-sxm-141gb": "h200",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """A point-to-point link between two pipeline stages."""

    name: str
    """Canonical name, e.g. 'nvlink4'."""
    gb_per_s: float
    """Peak bandwidth in one direction (GB/s, 1e9 bytes/s)."""
    latency_us: float
    """Fixed cost per message (microseconds): an order-of-magnitude NCCL send/recv estimate, not a spec."""


LINKS: dict[str, LinkSpec] = _by_name(
    LinkSpec(name="nvlink3", gb_per_s=300.0, latency_us=5.0),  # A100: 600 GB/s total, both directions
    LinkSpec(name="nvlink4", gb_per_s=450.0, latency_us=5.0),  # H100/H200: 900 GB/s total
    LinkSpec(name="pcie4", gb_per_s=32.0, latency_us=10.0),  # Gen4 x16: 16 GT/s x 16 lanes
    LinkSpec(name="pcie5", gb_per_s=64.0, latency_us=10.0),  # Gen5 x16: 32 GT/s x 16 lanes
    LinkSpec(name="ib-hdr", gb_per_s=25.0, latency_us=15.0),  # HDR 200 Gb/s, one HCA per GPU
    LinkSpec(name="ib-ndr", gb_per_s=50.0, latency_us=15.0),  # NDR 400 Gb/s, one HCA per GPU
)
_LINK_ALIASES = {
    "ib-ndr400": "ib-ndr",
    "ib-hdr200": "ib-hdr",
    "pcie-gen4": "pcie4",
    "pcie-gen5": "pcie5",
    "nvlink-3": "nvlink3",
    "nvlink-4": "nvlink4",
}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").strip("-")


def _lookup(kind: str, name: str, table: dict[str, Any], aliases: dict[str, str], key: str = "") -> Any:
    """Find `key` (default: `name`, normalised) in `table`, applying `aliases`; errors quote `name`."""
    key = _norm(key or name)
    key = aliases.get(key, key)
    if key not in table:
        raise TfplanError(f"unknown {kind} {name!r}; known: {', '.join(table)} (or {', '.join(aliases)})")
    return table[key]


def get_model(model: str | Any) -> ModelShape:
    """Resolve a model name, a ModelShape, or any shape-like object or mapping (e.g. a Hugging Face config).

    >>> get_model("Llama-3-8B").hidden_size
    4096

    Raises:
        TfplanError: an unknown name (the message lists the known ones) or a shape missing a field.
    """
    if isinstance(model, ModelShape):
        return model
    if not isinstance(model, str):
        return _shape_from_object(model)
    key = _norm(model).removeprefix("meta-llama/").removesuffix("-instruct").replace("llama-", "llama")
    return _lookup("model", model, MODELS, _MODEL_ALIASES, key)


def _shape_from_object(obj: Any) -> ModelShape:
    def read(names: tuple[str, ...]) -> Any:
        got = (obj.get(n) if isinstance(obj, Mapping) else getattr(obj, n, None) for n in names)
        return next((v for v in got if v is not None), None)

    values = {f: read(names) for f, names in _SHAPE_ATTRS.items()}
    values["num_kv_heads"] = values["num_kv_heads"] or values["num_heads"]  # absent: plain multi-head
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            tried = ", ".join(_SHAPE_ATTRS[key])
            raise TfplanError(f"model shape: {key} must be a positive int (tried {tried}), got {value!r}")
    if values["hidden_size"] % values["num_heads"] or values["num_heads"] % values["num_kv_heads"]:
        raise TfplanError(f"model shape: heads must divide hidden_size, kv heads must divide heads: {values}")
    tied = bool(read(("tie_embeddings", "tie_word_embeddings")))
    return ModelShape(name=str(read(("name", "model_type")) or "custom"), tie_embeddings=tied, **values)


def get_gpu(gpu: str | GpuSpec) -> GpuSpec:
    """Resolve a GPU name ('a100', 'H100-SXM', 'nvidia h200', ...) or pass a GpuSpec through.

    Raises:
        TfplanError: an unknown name (the message lists the known ones).
    """
    if isinstance(gpu, GpuSpec):
        return gpu
    return _lookup("GPU", gpu, GPUS, _GPU_ALIASES, _norm(gpu).removeprefix("nvidia"))


def get_link(link: str | LinkSpec, gpu: str | GpuSpec) -> LinkSpec:
    """Resolve a link: a generic kind ('nvlink', 'pcie', 'ib') takes the GPU's generation; a specific
    name ('nvlink3', 'pcie5', 'ib-ndr', ...) or a LinkSpec is used as given.

    >>> get_link("nvlink", "a100").gb_per_s
    300.0

    Raises:
        TfplanError: an unknown name (the message lists the known ones).
    """
    if isinstance(link, LinkSpec):
        return link
    nvlink, pcie, ib = get_gpu(gpu).links
    generic = {"nvlink": nvlink, "pcie": pcie, "ib": ib, "infiniband": ib}
    return _lookup("link", link, LINKS, _LINK_ALIASES | generic)

"""Analytic cost model: per-layer action times of a LLaMA-style model on a GPU, from FLOPs and bytes.

Lets a laptop plan for a GPU cluster without profiling it::

    from tfplan.cost.costmodel import analytic_profile
    profile = analytic_profile("llama3-8b", "h200", microbatch_size=1, seq_len=2048)

The result is a per-layer Profile ([embed, block0..block{L-1}, head]) that tfplan splits into stages.
Time of an action = matmul FLOPs / (peak bf16 FLOP/s x mfu) + bytes of the memory-bound work that the
mfu does not scale with / peak HBM bandwidth. docs/cost-model.md gives every formula, constant and source.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from tfplan.cost.hardware import GpuSpec, LinkSpec, ModelShape, get_gpu, get_link, get_model
from tfplan.cost.profile import Profile, StageCost
from tfplan.errors import TfplanError

FORMULA_VERSION = 2
"""Bumped whenever a formula or constant changes, so a profile names the model it came from."""
DEFAULT_MFU = 0.40
"""Achieved fraction of peak bf16 FLOP/s; Llama 3 paper, Table 4: 38-43% BF16 MFU on H100 (docs)."""
BF16_BYTES = 2
"""Bytes per activation, weight and gradient element (bf16 everywhere, as in mixed-precision training)."""
GRAD_ACCUMULATE_BYTES = 3 * BF16_BYTES
"""Per parameter per micro-batch: `.grad += g` reads two bf16 tensors and writes one (Note [memory terms])."""
CE_FORWARD_BYTES_PER_LOGIT = 14
"""Cross-entropy forward: cast bf16 logits to fp32 (2 + 4), log-softmax (4 + 4); bytes per logit."""
CE_BACKWARD_BYTES_PER_LOGIT = 22
"""Cross-entropy backward: nll grad (4), log-softmax grad (4 + 4 + 4), cast back to bf16 (4 + 2)."""
OPTIMIZER_BYTES_PER_PARAM = 28
"""AdamW step, memory-bound: reads fp32 master weight, gradient and both moments (16), writes the weight and
both moments (12). The step's tail after each rank's last action (tfplan.step.dag Note [rank tails])."""
GRAD_REDUCE_BYTES_PER_PARAM = 4
"""Bytes per parameter that data parallelism reduces across replicas (fp32 gradients, torchtitan's default
reduce dtype); tfplan.cost.dataparallel turns them into time."""

# Note [memory terms]: the mfu is measured end to end on transformer blocks, so it already folds in the
# elementwise kernels (norms, rotary, SwiGLU product, residual adds), whose bytes scale with the matmuls'
# FLOPs. Three costs do not scale that way and are charged as bytes / peak HBM bandwidth instead:
# the embedding gather and its dense gradient (no matmul at all), cross-entropy over the 128K-wide logits,
# and accumulating every weight gradient into `.grad` (bytes per parameter, not per token). The embedding
# gradient and the accumulation are weight-gradient work, so freezing removes them.


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerWork:
    """Work of one layer for one micro-batch: matmul FLOPs (run at mfu) and bytes (run at HBM bandwidth)."""

    name: str
    """'embed', 'block{i}' or 'head'."""
    forward_flops: float = 0.0
    """F: matmul FLOPs (one multiply-add = 2 FLOPs)."""
    backward_input_flops: float = 0.0
    """I: FLOPs of the gradient with respect to the layer's input (needed even when frozen)."""
    backward_weight_flops: float = 0.0
    """W: FLOPs of the gradients with respect to the layer's weights (skipped when frozen)."""
    forward_bytes: float = 0.0
    """F: bytes of memory-bound work outside the mfu (Note [memory terms])."""
    backward_input_bytes: float = 0.0
    """I: bytes of memory-bound work outside the mfu."""
    backward_weight_bytes: float = 0.0
    """W: bytes of memory-bound work outside the mfu (gradient accumulation, dense embedding gradient)."""
    params: float = 0.0
    """Trainable parameters (the optimizer's work and the data-parallel reduction scale with them)."""


def parameter_count(model: str | Any) -> int:
    """Trainable parameters, counting a tied embedding once.

    >>> parameter_count("llama3.1-8b")
    8030261248
    """
    m = get_model(model)
    embed = m.vocab_size * m.hidden_size
    head = m.hidden_size + (0 if m.tie_embeddings else embed)  # final RMSNorm weight (+ untied output matrix)
    return embed + m.num_layers * _block_params(m) + head


def _block_params(m: ModelShape) -> int:
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attention = m.hidden_size * (2 * q_out + 2 * kv_out)  # wq, wo (d x h*hd); wk, wv (d x h_kv*hd)
    return attention + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size  # + SwiGLU + 2 RMSNorms


def block_forward_flops(model: str | Any, microbatch_size: int, seq_len: int) -> dict[str, float]:
    """Forward FLOPs of one transformer block per matmul, for B sequences of T tokens.

    Note [causal attention]: the score (QK^T) and value (AV) matmuls are counted over the T(T+1)/2
    unmasked (query, key) pairs, because causal flash-attention kernels skip masked tiles; counting the
    full T^2 (the PaLM/Megatron MFU convention) would charge work that never runs.

    >>> block_forward_flops("llama3-8b", 1, 1)["q"]  # 2 x 1 token x 4096 x 4096
    33554432.0
    """
    m = get_model(model)
    _check_batch(microbatch_size, seq_len)
    tokens, d, f = microbatch_size * seq_len, m.hidden_size, m.intermediate_size
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    pairs = microbatch_size * seq_len * (seq_len + 1) / 2  # unmasked (query, key) pairs per head
    attention = 2.0 * m.num_heads * m.head_dim * pairs  # per query head: one dot product of head_dim per pair
    return {
        "q": 2.0 * tokens * d * q_out,
        "k": 2.0 * tokens * d * kv_out,
        "v": 2.0 * tokens * d * kv_out,
        "scores": attention,
        "av": attention,
        "o": 2.0 * tokens * q_out * d,  # attention: no weights
        "gate": 2.0 * tokens * d * f,
        "up": 2.0 * tokens * d * f,
        "down": 2.0 * tokens * f * d,
    }


def layer_work(model: str | Any, microbatch_size: int, seq_len: int) -> tuple[LayerWork, ...]:
    """Work of every layer for one micro-batch: embed, block0..block{L-1}, head.

    Backward rule: a matmul with a weight costs its forward FLOPs once for the input gradient and once
    for the weight gradient; the attention matmuls (no weights) cost twice their forward FLOPs, all
    input gradient. Recomputation (activation checkpointing, flash-attention's score recompute) is not
    counted: like the mfu, these are model FLOPs.
    """
    m = get_model(model)
    parts = block_forward_flops(m, microbatch_size, seq_len)
    tokens, d, vocab = microbatch_size * seq_len, m.hidden_size, m.vocab_size
    linear = sum(v for k, v in parts.items() if k not in ("scores", "av"))
    attention = parts["scores"] + parts["av"]
    # Embedding: a gather reads and writes tokens x d; its gradient zero-fills a dense V x d tensor
    # (2 bytes/element), index-adds tokens x d rows (6 bytes/element) and accumulates into .grad.
    embed_grad = (BF16_BYTES + GRAD_ACCUMULATE_BYTES) * vocab * d + 3.0 * BF16_BYTES * tokens * d
    embed = LayerWork(name="embed", forward_bytes=2.0 * BF16_BYTES * tokens * d, backward_weight_bytes=embed_grad,
                      params=float(vocab * d))
    block_accumulate = GRAD_ACCUMULATE_BYTES * float(_block_params(m))
    blocks = [
        LayerWork(
            name=f"block{i}",
            forward_flops=linear + attention,
            backward_weight_flops=linear,
            backward_input_flops=linear + 2.0 * attention,
            backward_weight_bytes=block_accumulate,
            params=float(_block_params(m)),
        )
        for i in range(m.num_layers)
    ]
    # Head: final RMSNorm (elementwise, inside the mfu), output matmul d -> V, cross-entropy on the logits.
    # Note [tied head]: the output matrix is charged as its own weight even when tied, because in a
    # pipeline the head and the embedding live on different ranks and each computes its own gradient.
    logits, head_matmul = float(tokens * vocab), 2.0 * tokens * d * vocab
    head = LayerWork(
        name="head",
        forward_flops=head_matmul,
        backward_input_flops=head_matmul,
        backward_weight_flops=head_matmul,
        forward_bytes=CE_FORWARD_BYTES_PER_LOGIT * logits,
        backward_input_bytes=CE_BACKWARD_BYTES_PER_LOGIT * logits,
        backward_weight_bytes=GRAD_ACCUMULATE_BYTES * float(vocab * d + d),
        params=float(vocab * d + d),
    )  # matrix + norm
    return (embed, *blocks, head)


def step_flops(model: str | Any, microbatch_size: int, seq_len: int, num_microbatches: int = 1) -> float:
    """Matmul FLOPs of a whole training step (forward and full backward of every layer, nothing frozen).

    For dense transformers this is close to 6 x parameters x tokens plus the attention term
    (tests/tfplan/cost/test_costmodel.py checks it for the 8B model).
    """
    if num_microbatches < 1:
        raise TfplanError(f"num_microbatches: must be >= 1, got {num_microbatches}")
    work = layer_work(model, microbatch_size, seq_len)
    return num_microbatches * sum(w.forward_flops + w.backward_input_flops + w.backward_weight_flops for w in work)


def _check_batch(microbatch_size: int, seq_len: int) -> None:
    for label, value in (("microbatch_size", microbatch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TfplanError(f"{label}: must be a positive integer, got {value!r}")


def p2p_ms(model: str | Any, microbatch_size: int, seq_len: int, link: str | LinkSpec, gpu: str | GpuSpec) -> float:
    """Time to send one micro-batch's activations (B x T x d bf16) to the next stage, or the same-sized
    gradient back: bytes / bandwidth + latency. No overlap with compute is assumed.

    >>> round(p2p_ms("llama3-8b", 1, 2048, "nvlink", "h100"), 4)
    0.0423
    """
    m, spec = get_model(model), get_link(link, gpu)
    _check_batch(microbatch_size, seq_len)
    nbytes = BF16_BYTES * microbatch_size * seq_len * m.hidden_size
    return nbytes / (spec.gb_per_s * 1e9) * 1e3 + spec.latency_us / 1e3


def analytic_profile(
    model: str | Any,
    gpu: str | GpuSpec,
    microbatch_size: int,
    seq_len: int,
    *,
    mfu: float = DEFAULT_MFU,
    link: str | LinkSpec = "nvlink",
    step_overhead_ms: float = 0.0,
    name: str | None = None,
) -> Profile:
    """A per-layer Profile ([embed, block0..block{L-1}, head]) predicted from FLOPs and bytes.

    Per layer: backward_ms = I + W, backward_frozen_ms = backward_input_ms = I, backward_weight_ms = W,
    backward_weight_frozen_ms = 0, tail_ms = the AdamW step over its parameters (memory-bound,
    OPTIMIZER_BYTES_PER_PARAM), grad_bytes = GRAD_REDUCE_BYTES_PER_PARAM per parameter.
    partition_layers applies the stage-0 rule (no input gradient).

    Args:
        model: a model name (see MODELS; aliases such as 'llama3-8b') or any shape object.
        gpu: a GPU name (see GPUS) or a GpuSpec.
        microbatch_size: sequences per micro-batch B.
        seq_len: tokens per sequence T.
        mfu: achieved fraction of peak bf16 FLOP/s for matmuls, in (0, 1].
        link: link between consecutive stages ('nvlink', 'pcie', 'ib', a specific generation, or a LinkSpec).
        step_overhead_ms: per-step time outside the actions (optimizer etc.), passed through; not modelled.
        name: profile name; default 'analytic-{model}-{gpu}-b{B}-t{T}'.

    Raises:
        TfplanError: unknown names, or a non-positive batch, sequence length or mfu.
    """
    m, g = get_model(model), get_gpu(gpu)
    spec = get_link(link, g)
    _check_batch(microbatch_size, seq_len)
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0.0 < mfu <= 1.0:
        raise TfplanError(f"mfu: must be in (0, 1], got {mfu!r}")
    if step_overhead_ms < 0:
        raise TfplanError(f"step_overhead_ms: must be >= 0, got {step_overhead_ms!r}")
    # A linear layer over N tokens does about N FLOPs per weight byte; below the ridge point (peak FLOP/s
    # over HBM bytes/s) it is memory-bound and a constant mfu is optimistic.
    ridge, tokens = g.peak_bf16_tflops * 1e3 / g.hbm_gb_per_s, microbatch_size * seq_len
    if tokens < ridge:
        warnings.warn(
            f"{tokens} tokens per micro-batch is below the {g.name} ridge point (~{ridge:.0f}): "
            "matmuls are memory-bound there and the analytic times are optimistic",
            stacklevel=2,
        )
    flop_ms = 1e3 / (g.peak_bf16_tflops * 1e12 * mfu)  # ms per FLOP
    byte_ms = 1e3 / (g.hbm_gb_per_s * 1e9)  # ms per byte
    layers = []
    for w in layer_work(m, microbatch_size, seq_len):
        input_ms = w.backward_input_flops * flop_ms + w.backward_input_bytes * byte_ms
        weight_ms = w.backward_weight_flops * flop_ms + w.backward_weight_bytes * byte_ms
        layers.append(
            StageCost(
                name=w.name,
                forward_ms=w.forward_flops * flop_ms + w.forward_bytes * byte_ms,
                backward_ms=input_ms + weight_ms,
                backward_frozen_ms=input_ms,
                backward_input_ms=input_ms,
                backward_weight_ms=weight_ms,
                backward_weight_frozen_ms=0.0,
                tail_ms=w.params * OPTIMIZER_BYTES_PER_PARAM * byte_ms,
                grad_bytes=w.params * GRAD_REDUCE_BYTES_PER_PARAM,
            )
        )
    source = {
        "kind": "analytic",
        "formula": f"tfplan.cost.costmodel v{FORMULA_VERSION} (docs/cost-model.md)",
        "formula_version": FORMULA_VERSION,
        "model": m.name,
        "gpu": g.name,
        "mfu": float(mfu),
        "link": spec.name,
        "microbatch_size": microbatch_size,
        "seq_len": seq_len,
        "peak_bf16_tflops": g.peak_bf16_tflops,
        "hbm_gb_per_s": g.hbm_gb_per_s,
        "link_gb_per_s": spec.gb_per_s,
        "link_latency_us": spec.latency_us,
    }
    name = name or f"analytic-{m.name}-{g.name}-b{microbatch_size}-t{seq_len}"
    return Profile(
        name=name,
        source=source,
        p2p_ms=p2p_ms(m, microbatch_size, seq_len, spec, g),
        step_overhead_ms=float(step_overhead_ms),
        layers=tuple(layers),
    )

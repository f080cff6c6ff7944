"""Small random Hugging Face LLaMA checkpoints for the tests, built with transformers (the reference; it is a
test-only dependency) and written with `save_pretrained`, so nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
"""LLaMA 3.1's rope scaling, with an original context short enough that the test sequences reach past it."""


def llama_config(*, vocab: int = 300, dim: int = 32, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                 ffn: int = 48, tied: bool = False, rope_scaling: dict | None = None, max_pos: int = 128):
    from transformers import LlamaConfig

    extra = {"rope_scaling": dict(rope_scaling), "rope_theta": 10000.0} if rope_scaling else {}
    return LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                       tie_word_embeddings=tied, rms_norm_eps=1e-5, **extra)


def make_llama(folder: Path, *, seed: int = 0, shard_kb: int | None = None, scale: float = 1.0, **shape):
    """Save a random LlamaForCausalLM of `shape` (llama_config's arguments) to `folder`; returns the model (eval).

    `scale` multiplies every weight drawn (transformers draws N(0, 0.02)): larger weights make logits that
    differ visibly between positions, so an equality test means something."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(**shape)).eval()
    if scale != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.mul_(scale)
    kwargs = {"max_shard_size": f"{shard_kb}KB"} if shard_kb else {}
    model.save_pretrained(folder, **kwargs)
    return model

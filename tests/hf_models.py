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


FAMILY_OPTIONS = {  # model_type -> what its small test checkpoint sets beyond the shape (Note [families])
    "llama": {},
    "llama-biases": {"attention_bias": True, "mlp_bias": True},
    "qwen2": {},
    "qwen3": {"head_dim": 16},  # heads wider than hidden / heads (32 / 4 = 8), as Qwen3's are
    "mistral": {"sliding_window": 64},
}


def family_config(family: str, *, vocab: int = 300, dim: int = 32, layers: int = 4, heads: int = 4,
                  kv_heads: int = 2, ffn: int = 48, tied: bool = False, max_pos: int = 128, **extra):
    """A small transformers config of `family` (a key of FAMILY_OPTIONS)."""
    import transformers

    model_type = family.split("-")[0]
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "mistral": transformers.MistralConfig}[model_type]
    return cls(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
               tie_word_embeddings=tied, rms_norm_eps=1e-5, **FAMILY_OPTIONS[family], **extra)


def make_family(folder: Path, family: str, *, seed: int = 0, scale: float = 1.0, **shape):
    """Save a random CausalLM of `family` (family_config's arguments) to `folder`; returns the model (eval).
    Biases and norm weights are drawn too (transformers starts them at 0 and 1), so that a bias or a q/k norm
    read wrongly shows in the logits."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(family_config(family, **shape)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif scale != 1.0:
                p.mul_(scale)
    model.save_pretrained(folder)
    return model


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

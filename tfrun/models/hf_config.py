"""A Hugging Face checkpoint's config.json, read by what each field does to a training forward.

Note [config fields by effect]: real config files carry far more than a model's shape: token ids, generation
settings, initialisation, output flags and the metadata of whatever saved them (`_name_or_path`, `_commit_hash`,
`transformers_version`, a `quantization_config` left by a dequantized checkpoint...). The rule, per field:
  * read: the shape and the options tfrun implements (sizes, heads, rope, eps, ties, the families' biases,
    q/k norms, head width and sliding window: Note [families] in tfrun.models.shape), per `model_type`;
  * refused by name when its value changes the forward and tfrun does not implement that value (another
    activation, dropout during training, cross-attention, a window tfrun's sequences would exceed...: FORWARD);
  * accepted silently: every field transformers' own config classes define without effect on a training forward
    (token ids, generation, initialisation, output flags, metadata: HARMLESS) and every `_`-prefixed name;
  * unknown fields: accepted with one warning naming them, unless the name speaks of the forward (it contains
    one of FORWARD_WORDS: attention, bias, norm, window, dropout, rope, expert, scale, ...) and its value is not
    inert (null, false, 0, "", [] or {}): then refused by name. A misread shape trains a different model than
    the user's without a sign, so a field that may be one is refused; a field that cannot be (a label, a
    tokenizer setting a newer transformers added) must not make a user edit JSON before the first run.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from tfrun.errors import TfrunError
from tfrun.models.llama import ModelConfig, ModelError
from tfrun.models.rope import RopeScaling

log = logging.getLogger(__name__)

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
"""model_type values tfrun reads."""
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "mistral": "MistralForCausalLM"}
SHAPE = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
         "rope_parameters", "tie_word_embeddings", "head_dim", "model_type", "attention_bias", "mlp_bias",
         "sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}
"""Fields read into the ModelConfig (per family: `_options`)."""
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
FORWARD = {"hidden_act": ("silu",), "attention_dropout": (0, 0.0), "is_encoder_decoder": (False,),
           "add_cross_attention": (False,), "cross_attention_hidden_size": (None,), "tie_encoder_decoder": (False,),
           "pruned_heads": ({},), "use_mrope": (False,)}
"""Fields that change the forward: the values tfrun implements (any other is refused by name)."""
HARMLESS = {
    # metadata
    "architectures", "transformers_version", "torch_dtype", "dtype", "tokenizer_class", "finetuning_task",
    "id2label", "label2id", "problem_type", "prefix", "task_specific_params", "use_bfloat16", "torchscript",
    "tf_legacy_loss", "is_decoder", "quantization_config",
    # token ids
    "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id", "cls_token_id",
    "mask_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id",
    "begin_suppress_tokens", "suppress_tokens", "bad_words_ids",
    # generation
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "remove_invalid_values", "exponential_decay_length_penalty", "use_cache",
    # (feed-forward chunking computes the same values in pieces)
    "chunk_size_feed_forward",
    # initialisation (pretraining_tp > 1 splits LLaMA's matmuls into slices: the same values)
    "initializer_range", "pretraining_tp",
    # output flags
    "output_attentions", "output_hidden_states", "return_dict", "output_router_logits",
}
"""What transformers' config classes define without effect on a training forward (Note [config fields by
effect])."""
FORWARD_WORDS = ("attn", "attention", "bias", "norm", "window", "dropout", "pdrop", "act", "rope", "rotary",
                 "position", "expert", "moe", "router", "softcap", "scale", "scaling", "multiplier", "embed",
                 "layer", "head", "hidden", "intermediate", "kv", "query", "key", "value", "mlp", "ffn", "logit")
"""Words in an unknown field's name that mark it as possibly changing the model (Note [config fields by effect])."""
ROPE_FIELDS = {"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings", "rope_theta"}
QWEN3_HEAD_DIM = 128
"""Qwen3Config's head_dim when config.json leaves it out (transformers' default)."""
MISTRAL_WINDOW = 4096
"""MistralConfig's sliding_window when config.json leaves it out (transformers' default)."""


def read_config(path: Path, raw: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of config.json `raw` (read from `path`).

    Raises:
        ModelError: one line naming config.json and the field (Note [config fields by effect]).
    """
    family = raw.get("model_type")
    if family not in FAMILIES:
        arch = ", ".join(raw.get("architectures") or []) or "none given"
        raise ModelError(f"{path}: model_type {family!r} (architectures: {arch}) is not a family tfrun reads "
                         f"({', '.join(FAMILIES)})")
    unknown = []
    for key, value in raw.items():
        if key in SHAPE or key in HARMLESS or key.startswith("_"):
            continue
        if key in FORWARD:
            if value not in FORWARD[key] and not (value is None and key != "hidden_act"):
                raise ModelError(f"{path}: {key} = {json.dumps(value)} is not supported (tfrun implements "
                                 f"{' or '.join(json.dumps(v) for v in FORWARD[key])})")
            continue
        if _names_the_forward(key) and not _inert(value):
            raise ModelError(f"{path}: field {key!r} = {_short(value)} may change the model and tfrun does not "
                             f"implement it (a field tfrun does not know, whose name speaks of the forward)")
        unknown.append(key)
    if unknown:
        _warn_once(str(path), tuple(unknown))
    for key in REQUIRED:
        if not isinstance(raw.get(key), int) or isinstance(raw.get(key), bool):
            raise ModelError(f"{path}: {key}: must be an integer, got {json.dumps(raw.get(key))}")
    theta, scaling = _rope(raw, path)
    try:
        return ModelConfig(
            vocab_size=raw["vocab_size"], dim=raw["hidden_size"], n_layers=raw["num_hidden_layers"],
            n_heads=raw["num_attention_heads"], n_kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
            ffn_dim=raw["intermediate_size"], max_seq_len=raw.get("max_position_embeddings", 2048),
            rope_theta=float(theta), norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope_scaling=scaling, family=family, **_options(family, raw, path),
        )
    except (ModelError, TypeError) as exc:
        raise ModelError(f"{path}: {exc}") from None


def _options(family: str, raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The family's options of the block (Note [families] in tfrun.models.shape) from config.json."""
    bias = raw.get("attention_bias")
    if bias is not None and not isinstance(bias, bool):
        raise ModelError(f"{path}: attention_bias: must be true or false, got {json.dumps(bias)}")
    if raw.get("mlp_bias") is not None and not isinstance(raw["mlp_bias"], bool):
        raise ModelError(f"{path}: mlp_bias: must be true or false, got {json.dumps(raw['mlp_bias'])}")
    head_dim = raw.get("head_dim")
    if head_dim is None and family == "qwen3":
        head_dim = QWEN3_HEAD_DIM
    if head_dim is not None and (not isinstance(head_dim, int) or isinstance(head_dim, bool)):
        raise ModelError(f"{path}: head_dim: must be an integer, got {json.dumps(head_dim)}")
    if head_dim is not None and head_dim * raw["num_attention_heads"] == raw["hidden_size"]:
        head_dim = None  # the default width: the same model
    if family == "qwen2":  # transformers' Qwen2 has q, k, v biases whatever attention_bias says
        bias = False
    return {"attn_head_dim": head_dim, "qkv_bias": family == "qwen2" or bool(bias), "out_bias": bool(bias),
            "mlp_bias": bool(raw.get("mlp_bias")) if family == "llama" else _absent(raw, "mlp_bias", path),
            "qk_norm": family == "qwen3", "sliding_window": _window(family, raw, path)}


def _absent(raw: dict[str, Any], key: str, path: Path) -> bool:
    if raw.get(key):
        raise ModelError(f"{path}: {key} = {json.dumps(raw[key])} is not a {raw['model_type']} field tfrun reads")
    return False


def _window(family: str, raw: dict[str, Any], path: Path) -> int | None:
    """The sliding window a family's config puts on some layer (None: none), as transformers reads it."""
    if family == "llama":
        return _absent(raw, "sliding_window", path) or None
    window = raw.get("sliding_window", MISTRAL_WINDOW if family == "mistral" else 4096)
    if family in ("qwen2", "qwen3"):
        types = raw.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or any(t not in ("full_attention", "sliding_attention") for t in types):
                raise ModelError(f"{path}: layer_types: must list full_attention or sliding_attention per layer")
            window = window if "sliding_attention" in types else None
        elif not raw.get("use_sliding_window", False):
            window = None
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ModelError(f"{path}: sliding_window: must be a positive integer or null, got {json.dumps(window)}")
    return window


def _names_the_forward(key: str) -> bool:
    low = key.lower()
    return any(word in low for word in FORWARD_WORDS)


def _inert(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {})


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@functools.lru_cache(maxsize=64)
def _warn_once(path: str, names: tuple[str, ...]) -> None:
    """One warning per (file, unknown fields) in a process: every rank and tool reads the config again."""
    log.warning("%s: ignoring fields tfrun does not know: %s (none names a part of the forward: "
                "tfrun.models.hf_config)", path, ", ".join(names))


def _rope(raw: dict[str, Any], path: Path) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from either transformers 4's rope_theta + rope_scaling or 5's rope_parameters."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelError(f"{path}: rope_scaling: must be an object or null")
    for key in params:
        if key not in ROPE_FIELDS:
            raise ModelError(f"{path}: rope_scaling.{key} is not supported")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    try:
        scaling = RopeScaling(kind=kind, factor=float(params.get("factor", 1.0)),
                              low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                              high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                              original_max_seq_len=int(params.get("original_max_position_embeddings", 8192)))
    except (TfrunError, TypeError, ValueError) as exc:
        raise ModelError(f"{path}: {exc}") from None
    return theta, scaling

"""Hugging Face LLaMA checkpoints in: `--model hf:DIR` reads DIR/config.json and DIR's safetensors weights.

A checkpoint folder holds `config.json` (a LlamaConfig) and either `model.safetensors` or a sharded
`model.safetensors.index.json` (its `weight_map` names the shard of every tensor). `read_config` maps the
config onto tfrun.models.llama.ModelConfig and refuses, by name, every field whose meaning our model does not
implement; `check` reads only the safetensors headers (no tensor data) to verify every tensor the model needs
before any rank starts; `load_stage` fills one stage's module, opening only the shards that hold its tensors
and reading only its tensors (Note [stage-local loading]).

Our parameter names map one to one onto Hugging Face's (`hf_name`); the rotary layout is the same ("rotate
half", tfrun.models.rope), so weights load without permutation and our logits equal transformers' (tests).
Needs the `hf` extra (safetensors), imported when a checkpoint is read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfrun.errors import TfrunError
from tfrun.models.llama import ModelConfig, ModelError
from tfrun.models.rope import RopeScaling

PREFIX = "hf:"
"""`--model hf:DIR` names a Hugging Face checkpoint folder."""
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"

# config.json fields, by what we do with them. A field in none of these is refused by name (unless null).
_MAPPED = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
           "rope_parameters", "tie_word_embeddings", "head_dim", "model_type"}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_MUST_BE = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0}
"""Fields whose other values change the model (biases, another activation, dropout): refused."""
_IGNORED = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
            "transformers_version", "use_cache", "initializer_range", "pretraining_tp", "_name_or_path",
            "output_attentions", "output_hidden_states", "return_dict", "tokenizer_class"}
"""Metadata, generation and initialisation settings: no effect on a training forward."""
_ROPE_FIELDS = {"rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings", "rope_theta"}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
"""safetensors dtypes a weight may have; each is converted to the stage's float32 parameters."""

_BLOCK = {  # ours (within layers.{i}.) -> Hugging Face's (within model.layers.{i}.)
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight",
    "mlp.w3.weight": "mlp.up_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
}
_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    """Hugging Face's name of one of our parameters.

    >>> hf_name("layers.3.mlp.w1.weight"), hf_name("head.weight")
    ('model.layers.3.mlp.gate_proj.weight', 'lm_head.weight')
    """
    if name in _TOP:
        return _TOP[name]
    _, index, rest = name.split(".", 2)
    return f"model.layers.{index}.{_BLOCK[rest]}"


def folder_of(model: str) -> Path:
    """DIR of `hf:DIR`."""
    assert model.startswith(PREFIX), model
    return Path(model[len(PREFIX):])


def config_hash(folder: Path) -> str:
    """sha256 of config.json's bytes: the model's identity for provenance (tfrun.records.provenance)."""
    return "sha256:" + hashlib.sha256((Path(folder) / CONFIG).read_bytes()).hexdigest()


def read_raw(folder: Path) -> dict[str, Any]:
    """config.json as a JSON object. Raises ModelError (one line) when missing or not a JSON object."""
    path = Path(folder) / CONFIG
    if not Path(folder).is_dir():
        raise ModelError(f"--model hf:{folder}: no such folder")
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError(f"{path}: missing (a Hugging Face checkpoint folder has config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(obj, dict):
        raise ModelError(f"{path}: must be a JSON object")
    return obj


def read_config(folder: Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face LLaMA checkpoint folder.

    Raises:
        ModelError: one line naming config.json and the field: another architecture, a field we do not
            implement (biases, another activation, dropout, an unsupported rope scaling), a missing or
            inconsistent size.
    """
    path = Path(folder) / CONFIG
    raw = read_raw(folder)
    if raw.get("model_type") != "llama":
        arch = ", ".join(raw.get("architectures") or []) or "none given"
        raise ModelError(f"{path}: model_type {raw.get('model_type')!r} (architectures: {arch}) is not a LLaMA "
                         f"checkpoint; tfrun reads model_type 'llama'")
    for key, value in raw.items():
        if value is None or key in _MAPPED or key in _IGNORED:
            continue
        if key in _MUST_BE:
            if value != _MUST_BE[key]:
                raise ModelError(f"{path}: {key} = {json.dumps(value)} is not supported (tfrun's LLaMA needs "
                                 f"{json.dumps(_MUST_BE[key])})")
            continue
        raise ModelError(f"{path}: field {key!r} is not supported by tfrun's LLaMA")
    for key in _REQUIRED:
        if not isinstance(raw.get(key), int) or isinstance(raw.get(key), bool):
            raise ModelError(f"{path}: {key}: must be an integer, got {json.dumps(raw.get(key))}")
    heads = raw["num_attention_heads"]
    if raw.get("head_dim") is not None and raw["head_dim"] * heads != raw["hidden_size"]:
        raise ModelError(f"{path}: head_dim {raw['head_dim']} x num_attention_heads {heads} != hidden_size "
                         f"{raw['hidden_size']}: not supported")
    theta, scaling = _rope(raw, path)
    try:
        return ModelConfig(
            vocab_size=raw["vocab_size"], dim=raw["hidden_size"], n_layers=raw["num_hidden_layers"], n_heads=heads,
            n_kv_heads=raw.get("num_key_value_heads") or heads, ffn_dim=raw["intermediate_size"],
            max_seq_len=raw.get("max_position_embeddings", 2048), rope_theta=float(theta),
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
        )
    except (ModelError, TypeError) as exc:
        raise ModelError(f"{path}: {exc}") from None


def _rope(raw: dict[str, Any], path: Path) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from either transformers 4's rope_theta + rope_scaling or 5's rope_parameters."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelError(f"{path}: rope_scaling: must be an object or null")
    for key in params:
        if key not in _ROPE_FIELDS:
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


# ---------------------------------------------------------------------------------------------------------
# Weights


def source_name(name: str, cfg: ModelConfig) -> str:
    """The checkpoint tensor that fills our parameter `name`: a tied head reads the embedding (Note [tied
    embeddings] in tfrun.models.llama: a split model's head starts as its copy)."""
    return _TOP["embed.weight"] if name == "head.weight" and cfg.tie_embeddings else hf_name(name)


def weight_map(folder: Path) -> dict[str, str]:
    """Tensor name -> the file (in `folder`) that holds it, from the index or the single file's header.

    Raises:
        ModelError: no weights file, an unreadable index, or a shard it names that is missing.
    """
    folder = Path(folder)
    index = folder / INDEX
    if index.exists():
        try:
            obj = json.loads(index.read_text())
            mapping = obj["weight_map"]
            assert isinstance(mapping, dict) and all(isinstance(v, str) for v in mapping.values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AssertionError):
            raise ModelError(f"{index}: not a safetensors index (a JSON object with a weight_map)") from None
        for shard in sorted(set(mapping.values())):
            if not (folder / shard).is_file():
                raise ModelError(f"{index}: names shard {shard}, which is missing")
        return dict(mapping)
    if not (folder / WEIGHTS).is_file():
        raise ModelError(f"{folder}: no {WEIGHTS} or {INDEX}")
    with _open(folder / WEIGHTS) as f:
        return {name: WEIGHTS for name in f.keys()}  # noqa: SIM118 - safe_open has keys(), not iteration


def _open(path: Path):
    """safetensors' lazy reader (memory-maps the file, reads a tensor's bytes only when asked for it)."""
    try:
        import safetensors
    except ImportError:
        raise ModelError("--model hf:DIR needs the safetensors package: pip install 'timelyfreeze[hf]'") from None
    try:
        return safetensors.safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001 - SafetensorError and OSError: a damaged or truncated file
        raise ModelError(f"{path}: not a complete safetensors file ({exc})") from None


def _expected(cfg: ModelConfig, module: nn.Module) -> dict[str, tuple[str, torch.Size]]:
    """Our parameter name -> (checkpoint tensor, shape) for every parameter of `module`."""
    return {name: (source_name(name, cfg), p.shape) for name, p in module.named_parameters()}


def _check_tensor(f, file: Path, name: str, shape: torch.Size) -> None:
    piece = f.get_slice(name)
    if piece.get_dtype() not in FLOAT_DTYPES:
        raise ModelError(f"{file}: {name} has dtype {piece.get_dtype()}, expected a floating-point type "
                         f"({', '.join(FLOAT_DTYPES)})")
    if list(piece.get_shape()) != list(shape):
        raise ModelError(f"{file}: {name} has shape {list(piece.get_shape())}, config.json implies {list(shape)}")


def check(folder: Path, cfg: ModelConfig) -> None:
    """Before any rank starts: every tensor the whole model needs is there, complete, with its shape and a
    float dtype, and no tensor is left unused (headers only: no tensor data is read).

    Raises:
        ModelError: one line naming the file and the tensor.
    """
    from tfrun.models.llama import build_stage

    folder = Path(folder)
    whole = build_stage(cfg, 0, 1, seed=0, device="meta")
    needed = _expected(cfg, whole)
    if cfg.tie_embeddings and "head.weight" not in needed:
        needed["head.weight"] = (source_name("head.weight", cfg), whole.embed.weight.shape)
    mapping = weight_map(folder)
    by_file: dict[str, list[tuple[str, torch.Size]]] = {}
    for ours, (theirs, shape) in sorted(needed.items()):
        if theirs not in mapping:
            where = INDEX if (folder / INDEX).exists() else WEIGHTS
            raise ModelError(f"{folder / where}: no tensor {theirs} (for {ours}; config.json says "
                             f"{cfg.n_layers} layers)")
        by_file.setdefault(mapping[theirs], []).append((theirs, shape))
    used = {theirs for theirs, _ in needed.values()} | ({"lm_head.weight"} if cfg.tie_embeddings else set())
    for name in sorted(mapping):
        if name not in used and not name.endswith("rotary_emb.inv_freq"):
            raise ModelError(f"{folder / mapping[name]}: tensor {name} has no place in tfrun's LLaMA (another "
                             f"architecture, or biases config.json does not declare)")
    for file in sorted(set(mapping.values())):
        with _open(folder / file) as f:
            for theirs, shape in by_file.get(file, []):
                _check_tensor(f, folder / file, theirs, shape)


# Note [stage-local loading]: a rank builds its stage on the meta device, allocates it (untouched memory is not
# resident yet), and copies each parameter from the checkpoint, converting to float32 on the way. It opens only
# the shards that hold one of its tensors, with safetensors' lazy safe_open, and opens a shard anew for each
# tensor: safe_open memory-maps the file, and the pages it reads count in the process's resident memory until
# the file is closed, so one open per tensor keeps at most one tensor's pages mapped; tensors load largest first.
# Measured on a 2-stage split of a 4.1 GiB float32 checkpoint (benchmarks/hf_load_memory.py, docs/benchmarks.md):
# 57% of the checkpoint per rank at peak (2.36 GiB), of which 50% is the stage and 5% Python, torch and tfrun.
@torch.no_grad()
def load_stage(folder: Path, cfg: ModelConfig, module: nn.Module) -> list[str]:
    """Fill every parameter of `module` (an allocated stage of `cfg`) from the checkpoint in `folder`;
    returns the shard files it read, each once, in order (Note [stage-local loading]).

    Raises:
        ModelError: a tensor is missing, of another shape or not a float (check() finds these earlier).
    """
    folder = Path(folder)
    mapping = weight_map(folder)
    params = dict(module.named_parameters())
    files: list[str] = []
    # Largest first: a tensor's transient copies (its mapped pages, safetensors' tensor) then overlap a stage
    # that is still mostly untouched, and the last, small tensors add little to the peak.
    for ours, (theirs, _) in sorted(_expected(cfg, module).items(), key=lambda kv: -kv[1][1].numel()):
        if theirs not in mapping:
            raise ModelError(f"{folder}: no tensor {theirs} (for {ours})")
        file = mapping[theirs]
        if file not in files:
            files.append(file)
        with _open(folder / file) as f:
            _check_tensor(f, folder / file, theirs, params[ours].shape)
            params[ours].copy_(f.get_tensor(theirs))
    return files

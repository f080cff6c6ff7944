"""Hugging Face checkpoints in: `--model hf:DIR` reads DIR/config.json and DIR's safetensors weights.

A checkpoint folder holds `config.json` (a LLaMA, Qwen2, Qwen3 or Mistral config: tfrun.models.hf_config) and
either `model.safetensors` or a sharded `model.safetensors.index.json` (its `weight_map` names the shard of every
tensor). `read_config` maps the config onto tfrun.models.llama.ModelConfig and refuses, by name, every field
whose value changes the forward in a way our model does not implement (tfrun.models.hf_config Note [config
fields by effect]); `check` reads only the safetensors headers (no tensor data; a tied checkpoint's two matrices
are compared, a slice at a time) to verify every tensor the model needs before any rank starts; `load_stage`
fills one stage's module, opening only the shards that hold its tensors and reading only its tensors (Note
[stage-local loading]).

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

from tfrun.models.llama import ModelConfig, ModelError

PREFIX = "hf:"
"""`--model hf:DIR` names a Hugging Face checkpoint folder."""
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"

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
    # the families' options (Note [families] in tfrun.models.shape)
    "attn.wq.bias": "self_attn.q_proj.bias",
    "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.bias": "self_attn.v_proj.bias",
    "attn.wo.bias": "self_attn.o_proj.bias",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp.w1.bias": "mlp.gate_proj.bias",
    "mlp.w3.bias": "mlp.up_proj.bias",
    "mlp.w2.bias": "mlp.down_proj.bias",
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
    """The ModelConfig of a Hugging Face checkpoint folder (tfrun.models.hf_config Note [config fields by effect]).

    Raises:
        ModelError: one line naming config.json and the field: a family tfrun does not read, a field whose value
            changes the forward and that tfrun does not implement, a missing or inconsistent size.
    """
    from tfrun.models import hf_config

    return hf_config.read_config(Path(folder) / CONFIG, read_raw(folder))


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
            raise ModelError(f"{folder / mapping[name]}: tensor {name} has no place in tfrun's model (another "
                             f"architecture, or biases config.json does not declare)")
    for file in sorted(set(mapping.values())):
        with _open(folder / file) as f:
            for theirs, shape in by_file.get(file, []):
                _check_tensor(f, folder / file, theirs, shape)
    head, embed = _TOP["head.weight"], _TOP["embed.weight"]
    if cfg.tie_embeddings and head in mapping and not _same_tensor(folder, mapping, head, embed):
        raise ModelError(f"{folder / mapping[head]}: config.json ties the LM head to the embedding "
                         f"(tie_word_embeddings true), but {head} differs from {embed}: the checkpoint is not tied "
                         f"in fact; set tie_word_embeddings to false to train them as two matrices")


def _same_tensor(folder: Path, mapping: dict[str, str], a: str, b: str, rows: int = 4096) -> bool:
    """Whether tensors `a` and `b` of the checkpoint hold the same values (compared `rows` rows at a time, so
    that a 128K-row vocabulary is never read whole)."""
    with _open(folder / mapping[a]) as fa, _open(folder / mapping[b]) as fb:
        sa, sb = fa.get_slice(a), fb.get_slice(b)
        if list(sa.get_shape()) != list(sb.get_shape()):
            return False
        for start in range(0, sa.get_shape()[0], rows):
            if not torch.equal(sa[start:start + rows].float(), sb[start:start + rows].float()):
                return False
    return True


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

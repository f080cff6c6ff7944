"""Checkpoints out: `tfrun export RUN_DIR --hf OUT [--step N]` writes a run's trained weights, every stage
merged, as a Hugging Face folder of the model's family (config.json + safetensors, sharded above a size with an
index; the run's tokenizer files beside them) that transformers' `from_pretrained` loads.

The weights come from one verified checkpoint (the newest that verifies, or --step N; tfrun.records.checkpoint Note
[checkpoint choice]); each rank file is memory-mapped, so only the model's tensors are read, never the
optimizer's. config.json is the source checkpoint's (for an hf:DIR run) or made from the named size's shape.
Tensors are written in float32, the dtype the run trained them in.

Note [exported ties]: a tied model is exported tied (tie_word_embeddings true, the matrix written once as the
embedding): a run keeps its two stages' copies one (tfrun.distributed.tied) and its checkpoints store it once.
A checkpoint that holds a head apart from its embedding (made before tfrun kept ties across stages) is exported
untied (tie_word_embeddings false, lm_head.weight written), with a warning, so that the export holds exactly the
trained model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tfrun.errors import TfrunError
from tfrun.models import hf
from tfrun.models.llama import ModelConfig

DEFAULT_SHARD_BYTES = 5 * 2**30
"""Shards hold at most this many bytes (5 GiB, transformers' long-standing default); a larger tensor alone."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Exported:
    """What an export wrote."""

    out: str
    """The folder."""
    step: int
    """The checkpoint's step (steps completed)."""
    files: list[str]
    """Weight files written (one, or the shards)."""
    num_params: int
    """Parameter elements written."""
    tied: bool
    """Whether the export ties lm_head to the embedding."""
    warnings: list[str]
    """Checkpoints skipped, a tie undone (Note [exported ties])."""


def _checkpoint_step(run: Path, world: int, step: int | None) -> tuple[int, list[str]]:
    from tfrun.records import checkpoint

    if step is None:
        chosen, _, warnings = checkpoint.choose(run, world)
        return chosen, warnings
    problem = checkpoint.verify(run, step) if checkpoint.folder(run, step).is_dir() else "no such checkpoint"
    if problem is not None:
        raise TfrunError(f"{run}: checkpoint step {step}: {problem}")
    return step, []


def merged_weights(run: Path, world: int, step: int) -> dict[str, torch.Tensor]:
    """Our parameter name -> tensor over every stage of checkpoint `step` (memory-mapped rank files)."""
    from tfrun.records import checkpoint

    out: dict[str, torch.Tensor] = {}
    for rank in range(world):
        path = checkpoint.folder(run, step) / f"rank{rank}.pt"
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        except (OSError, RuntimeError, EOFError) as exc:
            raise TfrunError(f"{path}: cannot read ({exc})") from None
        for module_state in state["models"].values():
            for name, tensor in module_state.items():
                assert name not in out or name == "head.weight", f"{name} on two stages"
                out[name] = tensor
    return out


def hf_config(model: str, cfg: ModelConfig, tied: bool) -> dict:
    """config.json of the export: the source checkpoint's (hf:DIR) or one made from cfg, with our ties."""
    if model.startswith(hf.PREFIX):
        raw = hf.read_raw(hf.folder_of(model))
    else:
        raw = config_of(cfg)
        if cfg.rope_scaling is not None:
            s = cfg.rope_scaling
            raw["rope_scaling"] = {"rope_type": s.kind, "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                                   "high_freq_factor": s.high_freq_factor,
                                   "original_max_position_embeddings": s.original_max_seq_len}
    raw = {k: v for k, v in raw.items() if k not in ("torch_dtype", "dtype")}
    return raw | {"tie_word_embeddings": tied, "torch_dtype": "float32"}


def config_of(cfg: ModelConfig) -> dict:
    """A config.json of cfg's family (model_type, and the fields its options are read from:
    tfrun.models.hf_config) for a model that has none (a named size, a checkpoint made here)."""
    from tfrun.models.hf_config import ARCHITECTURES

    raw = {"architectures": [ARCHITECTURES[cfg.family]], "model_type": cfg.family, "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
           "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
           "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
           "hidden_act": "silu", "tie_word_embeddings": cfg.tie_embeddings}
    if cfg.family in ("llama", "qwen3"):
        assert cfg.qkv_bias == cfg.out_bias, "LLaMA's and Qwen3's attention_bias covers q, k, v and o alike"
        raw["attention_bias"] = cfg.qkv_bias
    if cfg.family == "llama":
        raw["mlp_bias"] = cfg.mlp_bias
    if cfg.family in ("qwen2", "qwen3"):
        raw |= {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window}
    if cfg.family == "mistral":
        raw["sliding_window"] = cfg.sliding_window
    return raw


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def tokenizer_files(tokenizer_path: str | None) -> list[tuple[Path, str]]:
    """(file, its name in the export): the run's --tokenizer (as tokenizer.json) and the files a Hugging Face
    tokenizer folder keeps beside it (its config, special tokens, chat template), so that the export loads as a
    tokenizer too."""
    if tokenizer_path is None:
        return []
    tokenizer = Path(tokenizer_path)
    beside = [(tokenizer.parent / name, name) for name in TOKENIZER_FILES[1:]]
    return [(tokenizer, TOKENIZER_FILES[0])] + [(p, name) for p, name in beside if p.is_file()]


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, grouped greedily into shards of at most `limit` bytes (a larger tensor alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def export_hf(run_dir: str, out: str, *, step: int | None = None,
              max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Exported:
    """Write run `run_dir`'s weights at `step` (default: the newest checkpoint that verifies) to `out`.

    Raises:
        TfrunError: no run or no usable checkpoint there, a damaged checkpoint, `out` not a new folder, or
            the hf:DIR source's config.json gone. Nothing is written then; a partial export never appears
            under `out` (it is written beside it and renamed).
    """
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise TfrunError("tfrun export needs the safetensors package: pip install 'timelyfreeze[hf]'") from None

    from tfrun.config.train_config import TrainConfig
    from tfrun.models import model_config

    run, target = Path(run_dir), Path(out)
    if not (run / "run_config.json").is_file():
        raise TfrunError(f"{run_dir}: not a tfrun run folder (no run_config.json)")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise TfrunError(f"--hf {out}: exists and is not an empty folder; export into a new folder")
    parent = next((p for p in target.parents if p.exists()), Path("."))
    if not parent.is_dir():  # (mkdir's FileExistsError was a traceback)
        raise TfrunError(f"--hf {out}: {parent} is a file, not a folder")
    if max_shard_bytes < 1:
        raise TfrunError(f"--max-shard-mb must be > 0, got {max_shard_bytes / 2**20:g}")
    config = TrainConfig.load(run / "run_config.json")
    cfg = model_config(config.model)
    chosen, warnings = _checkpoint_step(run, config.num_ranks, step)
    ours = merged_weights(run, config.num_ranks, chosen)
    tied = cfg.tie_embeddings and ("head.weight" not in ours or torch.equal(ours["head.weight"], ours["embed.weight"]))
    if cfg.tie_embeddings and not tied:
        warnings.append("the tied embedding and LM head trained as two matrices on different stages (a run made "
                        "before tfrun kept ties across stages): exported untied (tie_word_embeddings false)")
    names = [n for n in ours if not (tied and n == "head.weight")]
    tensors = {hf.hf_name(n): ours[n].detach().to(torch.float32).contiguous() for n in names}
    shards = _shards(tensors, max_shard_bytes)
    files = [hf.WEIGHTS] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                                                   for i in range(len(shards))]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for file, shard in zip(files, shards):
            save_file(shard, str(tmp / file), metadata={"format": "pt"})
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(t.numel() * 4 for t in tensors.values())},
                     "weight_map": {name: file for file, shard in zip(files, shards) for name in shard}}
            (tmp / hf.INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (tmp / hf.CONFIG).write_text(json.dumps(hf_config(config.model, cfg, tied), indent=2) + "\n")
        for source, name in tokenizer_files(config.tokenizer_path):
            shutil.copy2(source, tmp / name)
        os.chmod(tmp, 0o755)
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.replace(tmp, target)
    except OSError as exc:
        raise TfrunError(f"--hf {out}: cannot write ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Exported(out=str(target), step=chosen, files=files, num_params=sum(t.numel() for t in tensors.values()),
                    tied=tied, warnings=warnings)

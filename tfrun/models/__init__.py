"""What a run can train: our LLaMA-style decoder at a named size (tfrun.models.llama), or a Hugging Face checkpoint
of the LLaMA, Qwen2, Qwen3 or Mistral family (`hf:DIR`, tfrun.models.hf). `model_config` and `build` are the one
place a model name becomes a shape and a stage module; tfrun.distributed.rank builds every rank's stages through
`build`.

Read in this order:
  rope.py    rotary position tables, with LLaMA 3's and linear scaling (Note [rope precision])
  shape.py   a model's shape (ModelConfig, with the families' options) and the named sizes
  llama.py   the decoder, split into stages: a stage module reads top to bottom
  hf_config.py  a Hugging Face config.json, read by what each field does to the forward
  hf.py      a Hugging Face checkpoint's weights, each rank loading its own stage only
(Weights out, as a Hugging Face checkpoint: tfrun.records.export.)

    from tfrun import models
    models.model_config("tiny").n_layers                 # 4
    stage = models.build("hf:ckpt/", 1, 2, seed=0)       # stage 1 of 2, weights from ckpt/'s safetensors
"""

from __future__ import annotations

from pathlib import Path

import torch

from tfrun.models import hf
from tfrun.models.llama import (
    MODELS,
    ModelConfig,
    ModelError,
    TransformerStage,
    build_stage,
    count_params,
    loss_fn,
    masked_loss,
    split_layers,
)
from tfrun.models.rope import RopeScaling

__all__ = ["MODELS", "ModelConfig", "ModelError", "RopeScaling", "TransformerStage", "build", "build_stage",
           "count_params", "is_hf", "loss_fn", "masked_loss", "model_config", "model_hash", "split_layers",
           "stage_numel"]


def is_hf(name: str) -> bool:
    """Whether `name` is `hf:DIR`."""
    return name.startswith(hf.PREFIX)


def model_config(name: str) -> ModelConfig:
    """The shape of model `name`: a key of MODELS or `hf:DIR` (its config.json).

    Raises:
        ModelError: an unknown name, or a config.json tfrun cannot run (tfrun.models.hf.read_config).
    """
    if is_hf(name):
        return hf.read_config(hf.folder_of(name))
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(MODELS)}, or hf:DIR (a Hugging Face checkpoint "
                         f"folder of LLaMA, Qwen2, Qwen3 or Mistral)")
    return MODELS[name]


def model_hash(name: str) -> str | None:
    """An `hf:DIR` model's identity (sha256 of its config.json); None for a named size."""
    return hf.config_hash(hf.folder_of(name)) if is_hf(name) else None


def build(name: str, stage_index: int, num_stages: int, seed: int, *,
          device: str | torch.device = "cpu") -> TransformerStage:
    """Stage `stage_index` of `num_stages` of model `name`: a named size initialised from `seed`, or an
    `hf:DIR` checkpoint's weights (only this stage's: tfrun.models.hf Note [stage-local loading])."""
    cfg = model_config(name)
    if not is_hf(name) or torch.device(device).type == "meta":
        return build_stage(cfg, stage_index, num_stages, seed, device=device)
    stage = build_stage(cfg, stage_index, num_stages, seed, device="meta")
    stage.to_empty(device=device)
    stage.reset_rope()
    hf.load_stage(hf.folder_of(name), cfg, stage)
    return stage


def stage_numel(name: str, num_stages: int) -> dict[int, int]:
    """Parameter elements of every stage of model `name` (shapes only: meta tensors)."""
    cfg = model_config(name)
    return {s: count_params(build_stage(cfg, s, num_stages, 0, device="meta")) for s in range(num_stages)}


def check(name: str) -> None:
    """Before any rank starts: an `hf:DIR` checkpoint holds every tensor its config needs (headers only)."""
    if is_hf(name):
        hf.check(hf.folder_of(name), model_config(name))


def absolute(name: str) -> str:
    """`hf:DIR` with DIR made absolute (so every rank and a resume name the same folder); others as given."""
    return hf.PREFIX + str(Path(hf.folder_of(name)).resolve()) if is_hf(name) else name

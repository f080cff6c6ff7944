"""What a run may trust and continue: the plan's profile against this run, a resumed run against its
checkpoint, and the output folder before anything is written.

Note [profile provenance]: a plan records the scalar fields of its profile's `source` (tfplan.plan.plan
`profile_source`). The run is compared with every one of these that the profile recorded:
  model             source.model              the run's --model; for an hf:DIR model source.model_hash, the
                    (source.model_hash)       sha256 of its config.json, instead of the folder's name (the same
                                              checkpoint copied elsewhere is the same model)
  micro-batch       source.microbatch_size    --microbatch-size (sequences per micro-batch)
  sequence length   source.seq_len            --seq-len
  device            source.device (measured)  "cpu" or the CUDA device's name, compared case-insensitively
                    source.gpu (analytic)     must occur in the CUDA device's name ("h200" in "NVIDIA H200")
  threads           source.threads_per_rank   --threads, for profiles measured on a CPU
  compute dtype     source.dtype (measured)   --precision as the run resolves it (float32 or bfloat16)
Measured profiles record all of them, analytic ones the model, batch shape and GPU, hand profiles usually
none (nothing is checked). A mismatch refuses the run with one line naming both sides; --force runs it and
reports prediction_error null with the mismatch as prediction_note. The rule is the same for a --freeze
timely seed plan.

Note [resume identity]: every checkpoint index records run_identity(config); a resume refuses any change
of IDENTITY's settings (one line naming the option), because the run would no longer continue the same loss
sequence. The optimizer's recipe (RECIPE: learning rate and its schedule, weight decay, betas, eps, clipping)
may change, with a warning naming each change: resuming a diverged run with a saner learning rate is what a
user does (tfrun.train Note [non-finite steps]).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tfrun.config.train_config import DEFAULT_OUT, TrainConfig
from tfrun.errors import TfrunError

IDENTITY: tuple[tuple[str, str], ...] = (
    ("plan_hash", "plan"), ("model", "--model"), ("model_hash", "--model's config.json"), ("seed", "--seed"),
    ("freeze_seed", "--freeze-seed"), ("freeze", "--freeze"), ("freeze_method", "--freeze-method"),
    ("freeze_policy", "--freeze-policy"),
    ("microbatch_size", "--microbatch-size"), ("seq_len", "--seq-len"), ("num_microbatches", "micro-batches per step"),
    ("redraw_every", "--redraw-every"),
    ("ramp_steps", "--ramp-steps"), ("grad_rescale", "--grad-rescale"), ("max_stale_steps", "--max-stale-steps"),
    ("data_hash", "--data"), ("dp", "--dp"), ("precision", "--precision"),
    ("noise_estimator", "--noise-estimator"), ("noise_measure", "--noise-measure"), ("noise_window", "--noise-window"),
    # --freeze timely only:
    ("max_freeze_ratio", "--max-freeze-ratio"), ("warmup_steps", "--warmup-steps"),
    ("monitor_steps", "--monitor-steps"), ("probe_steps", "--probe-steps"),
    ("replan_threshold", "--replan-threshold"), ("replan_window", "--replan-window"),
    ("noise_replan_z", "--noise-replan-z"),
)
"""(TrainConfig field, the option a user changes) that a resume must keep (Note [resume identity])."""
RECIPE: tuple[tuple[str, str], ...] = (
    ("lr", "--lr"), ("lr_schedule", "--lr-schedule"), ("lr_warmup_steps", "--lr-warmup-steps"),
    ("lr_min_ratio", "--lr-min-ratio"), ("lr_decay_fraction", "--lr-decay-fraction"),
    ("weight_decay", "--weight-decay"), ("adam_betas", "--adam-betas"), ("adam_eps", "--adam-eps"),
    ("clip_grad_norm", "--clip-grad-norm"),
)
"""Settings a resume may change, with a warning (Note [resume identity])."""
TIMELY_ONLY = ("max_freeze_ratio", "warmup_steps", "monitor_steps", "probe_steps", "replan_threshold",
               "replan_window", "noise_replan_z")
ADAM_BYTES_PER_PARAM = 12
"""Checkpoint bytes per fp32 parameter: the weight and AdamW's two moments (4 bytes each)."""


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def order_hash(order: list[list[str]]) -> str:
    """The identity of a generated schedule (a --freeze timely run without a plan file)."""
    return sha256_bytes(json.dumps(order, separators=(",", ":")).encode())


def _describe(model, mbs, seq, device, threads) -> str:
    parts = []
    if model is not None:
        parts.append(f"model {model}")
    if mbs is not None or seq is not None:
        parts.append(f"{'?' if mbs is None else mbs} x {'?' if seq is None else seq} tokens")
    if device is not None:
        parts.append(f"on {device}")
    if threads is not None:
        parts.append(f"{threads} thread{'s' if threads != 1 else ''} per rank")
    return ", ".join(parts)


def same_model(source: dict[str, Any], config: TrainConfig) -> bool:
    """Whether a profile's recorded model is this run's: by config hash when both are hf:DIR checkpoints,
    else by name (Note [profile provenance])."""
    ours = config.model_hash if config.model_hash is not None else _hf_hash(config.model)
    if source.get("model_hash") is not None and ours is not None:
        return source["model_hash"] == ours
    return source.get("model") == config.model


def _hf_hash(model: str) -> str | None:
    """An hf:DIR model's identity before setup recorded it (a relative DIR names the same checkpoint as the
    profile's absolute one); None for a named size or a folder without config.json (refused later, by name)."""
    from tfrun import models

    if not models.is_hf(model):
        return None
    try:
        return models.model_hash(model)
    except OSError:
        return None


def profile_mismatch(source: dict[str, Any], config: TrainConfig, device: str) -> str | None:
    """How the plan's profile (its recorded source) differs from this run (Note [profile provenance]), as
    "plan profiled model tiny, 4 x 128 tokens on cpu; this run is model small, 4 x 128 tokens on cpu
    (model differs)", or None when everything recorded matches."""
    differ: list[str] = []
    model, mbs, seq = source.get("model"), source.get("microbatch_size"), source.get("seq_len")
    if model is not None and not same_model(source, config):
        differ.append("model")
    if mbs is not None and mbs != config.microbatch_size:
        differ.append("micro-batch size")
    if seq is not None and seq != config.seq_len:
        differ.append("sequence length")
    theirs_device = source.get("device") if isinstance(source.get("device"), str) else None
    gpu = source.get("gpu") if isinstance(source.get("gpu"), str) else None
    if theirs_device is not None and theirs_device.lower() != device.lower():
        differ.append("device")
    elif theirs_device is None and gpu is not None and gpu.lower() not in device.lower().replace(" ", ""):
        differ.append("device")
    threads = source.get("threads_per_rank") if (theirs_device or "").lower() == "cpu" else None
    if threads is not None and threads != config.threads:
        differ.append("threads")
    dtype, ours_dtype = source.get("dtype"), config.compute_dtype(device.lower() != "cpu")
    if isinstance(dtype, str) and dtype != ours_dtype:
        differ.append(f"compute dtype ({dtype} vs {ours_dtype})")
    if not differ:
        return None
    shown = theirs_device or gpu
    theirs = _describe(model, mbs, seq, shown, threads)
    ours = _describe(config.model if model is not None else None, config.microbatch_size if mbs is not None else None,
                     config.seq_len if seq is not None else None, device if shown is not None else None,
                     config.threads if threads is not None else None)
    kind = source.get("kind", "profile")
    return f"plan profiled ({kind}) {theirs}; this run is {ours} ({', '.join(differ)} differ{'s' * (len(differ) == 1)})"


def check_plan_profile(plan_path: str, source: dict[str, Any], config: TrainConfig, force: bool) -> str | None:
    """Refuse a plan whose profile does not match the run, unless `force`; returns the prediction note
    (the mismatch) for a forced run, else None.

    Raises:
        TfrunError: the mismatch, with what to do.
    """
    from tfrun.measure.profile import run_device  # (imports torch: only where a profile is compared)

    mismatch = profile_mismatch(source, config, run_device())
    if mismatch is None:
        return None
    if force:
        return mismatch
    raise TfrunError(f"{plan_path}: {mismatch}; its predictions do not hold for this run: profile this setting "
                     f"and solve again, or pass --force to run it without a prediction")


# ---------------------------------------------------------------------------------------------------------
# Resume


def run_identity(config: TrainConfig) -> dict[str, Any]:
    """What a resumed run must keep (Note [resume identity]), as JSON."""
    return {field: getattr(config, field) for field, _ in IDENTITY + RECIPE
            if config.freeze == "timely" or field not in TIMELY_ONLY}


def recipe_changes(stored: dict[str, Any], config: TrainConfig) -> list[str]:
    """The optimizer settings a resume changes against its checkpoint's (Note [resume identity]), in words."""
    current = run_identity(config)
    return [f"the resumed run changes {option} from {_value(stored[field])} to {_value(current[field])}: its "
            f"losses will differ from an uninterrupted run's" for field, option in RECIPE
            if field in stored and stored[field] != current.get(field)]


def identity_change(stored: dict[str, Any], config: TrainConfig) -> str | None:
    """The first setting that differs between a checkpoint's identity and this run, in words; None if
    none (or the checkpoint recorded none)."""
    if not stored:
        return None
    current = run_identity(config)
    for field, option in IDENTITY:
        if field not in stored:  # (a checkpoint written before the setting existed)
            continue
        old, new = stored.get(field), current.get(field)
        if old == new:
            continue
        if field in ("plan_hash", "data_hash"):
            what = "a different plan" if field == "plan_hash" else "different training data (--data)"
            return f"the checkpoint was trained on {what} than this run's ({_short(old)} vs {_short(new)})"
        return f"the checkpoint was trained with {option} {_value(old)}, this run has {_value(new)}"
    return None


def _short(h: Any) -> str:
    return str(h)[:19] + "..." if isinstance(h, str) and len(h) > 22 else json.dumps(h)


def _value(v: Any) -> str:
    return "unset" if v is None else (v if isinstance(v, str) else json.dumps(v))


# ---------------------------------------------------------------------------------------------------------
# The output folder


def checkpoint_bytes(config: TrainConfig) -> int:
    """About how large one checkpoint is (all ranks): parameters x ADAM_BYTES_PER_PARAM (meta tensors)."""
    from tfrun.models import stage_numel

    return sum(stage_numel(config.model, config.num_stages).values()) * ADAM_BYTES_PER_PARAM


def check_out(out: Path, config: TrainConfig) -> list[str]:
    """Before training: `out` is (or can become) a folder we can write in, with room for a checkpoint, and holds no
    run unless resumed (or it is DEFAULT_OUT). Writes nothing that stays. Returns warnings (room for fewer
    checkpoints than are kept).

    Raises:
        TfrunError: not a folder, another run's folder, not writable (read-only, no permission) or not enough free
            space.
    """
    if out.exists() and not out.is_dir():
        raise TfrunError(f"--out {out}: exists and is not a folder")
    if not config.resume and config.out_dir != DEFAULT_OUT and (
            (out / "run_config.json").exists() or (out / "checkpoints").is_dir()):
        raise TfrunError(f"--out {out}: holds a run already (its checkpoints would be replaced); give a new folder, "
                         f"or --resume {out} to continue it")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise TfrunError(f"--out {out}: {probe} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe) as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise TfrunError(f"--out {out}: cannot write in {probe} ({exc.strerror or exc})") from None
    need = checkpoint_bytes(config)
    free = shutil.disk_usage(probe).free
    if free < need:
        raise TfrunError(f"--out {out}: {free / 2**20:.0f} MiB free in {probe}, but one checkpoint needs about "
                         f"{need / 2**20:.0f} MiB")
    kept = config.keep_checkpoints + 1 if config.keep_checkpoints else 2
    if free < need * kept:
        return [f"--out {out}: {free / 2**20:.0f} MiB free, room for fewer than the {kept} checkpoints of about "
                f"{need / 2**20:.0f} MiB each that exist while a new one is written"]
    return []

"""Checkpoints: every rank saves its own stages' model and optimizer state; rank 0 then points
`checkpoints/latest.json` at the step once every rank has written (after a barrier), so a crash never
leaves a half checkpoint marked as the latest. Data position and freeze selection are functions of the
step and seed, so (step, seed) restore them exactly; metrics so far travel with the checkpoint."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tfrun.errors import TfrunError


def _rank_file(out: Path, step: int, rank: int) -> Path:
    return out / "checkpoints" / f"step{step:07d}" / f"rank{rank}.pt"


def save(out: Path, rank: int, step: int, modules: dict, optimizer, batches, freezer, metrics: list[dict],
         online=None, write: bool = True) -> None:
    """Save this pipeline rank's state for resuming at `step` (the number of steps completed); one replica
    writes (`write`), every process takes part in the barrier."""
    if not write:
        dist.barrier()
        return
    path = _rank_file(out, step, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "models": {s: m.state_dict() for s, m in modules.items()},
        "optimizer": optimizer.state_dict(),
        "data": batches.state_dict(),
        "freezer": freezer.state_dict(),
        "metrics": metrics if rank == 0 else None,
        "online": online.state_dict() if online is not None else None,
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".rank", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    dist.barrier()
    if rank == 0:
        from tfplan.fileio import write_json_atomic

        write_json_atomic(out / "checkpoints" / "latest.json", {"step": step, "world_size": dist.get_world_size()})


def load(out: Path, rank: int, modules: dict, optimizer, batches, freezer, online=None) -> tuple[int, list[dict]]:
    """Restore this rank's state from out's latest checkpoint; returns (next step, metrics so far)."""
    latest = out / "checkpoints" / "latest.json"
    if not latest.exists():
        raise TfrunError(f"--resume: no checkpoint in {out} (missing {latest})")
    info = json.loads(latest.read_text())
    if info["world_size"] != dist.get_world_size():
        raise TfrunError(f"--resume: checkpoint has {info['world_size']} ranks, this job {dist.get_world_size()}")
    state = torch.load(_rank_file(out, info["step"], rank), weights_only=False)
    for s, module in modules.items():
        module.load_state_dict(state["models"][s])
    optimizer.load_state_dict(state["optimizer"])
    batches.load_state_dict(state["data"])
    freezer.load_state_dict(state["freezer"])
    if online is not None and state.get("online") is not None:
        online.load_state_dict(state["online"])
    metrics = state["metrics"] or []
    return int(state["step"]), metrics


def load_weights(src: Path, rank: int, modules: dict, dp: int = 1) -> int:
    """--init-from: this rank's stage weights from run `src`'s latest checkpoint (nothing else: the optimizer,
    data position and freezer start fresh); returns the step they were saved at.

    Raises:
        TfrunError: no checkpoint there, or one of another pipeline split (ranks, stages, model).
    """
    latest = src / "checkpoints" / "latest.json"
    if not latest.exists():
        raise TfrunError(f"--init-from {src}: no checkpoint there (missing {latest})")
    info = json.loads(latest.read_text())
    if info["world_size"] != dist.get_world_size() // dp and info["world_size"] != dist.get_world_size():
        raise TfrunError(f"--init-from {src}: its checkpoint has {info['world_size']} ranks, this job "
                         f"{dist.get_world_size() // dp} pipeline ranks")
    state = torch.load(_rank_file(src, info["step"], rank), weights_only=False)
    for s, module in modules.items():
        if s not in state["models"]:
            raise TfrunError(f"--init-from {src}: rank {rank} holds stages {sorted(state['models'])} there, "
                             f"stage {s} here: another pipeline split")
        missing, unexpected = module.load_state_dict(state["models"][s], strict=False)
        if missing or unexpected:
            raise TfrunError(f"--init-from {src}: stage {s} does not match (missing {missing[:2]}, unexpected "
                             f"{unexpected[:2]}): another model or split")
    return int(info["step"])

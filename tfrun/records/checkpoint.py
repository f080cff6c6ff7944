"""Checkpoints that a crash, a full disk or a damaged file never turn into a wrong resume.

Layout under OUT/checkpoints/ (docs/formats.md):
  stepNNNNNNN/rank{r}.pt    every pipeline rank's own stages: model, optimizer, data position, freezer, online
                            state; rank 0's also the metrics so far. With data parallelism, replica 0 writes
                            (global ranks 0 .. pp-1: tfrun.distributed.rank) and every replica of a pipeline rank loads
                            it
  stepNNNNNNN/index.json    written by rank 0 once every rank has saved: each file's size and sha256, the
                            world size and the run's identity (tfrun.records.provenance.run_identity)
  latest.json               {"step", "world_size"}: the newest complete checkpoint, written after its index

Note [checkpoint commit]: a rank file is written to a temp file, hashed while written, fsync'ed and renamed;
the ranks then send their (size, sha256) to rank 0, which writes the index (temp, fsync, rename), then
latest.json. A checkpoint without an index is incomplete and never used; a crash at any point leaves the
previous complete checkpoint as it was. Rank 0 then deletes checkpoints beyond the newest `keep`, incomplete
ones and any newer than the new one (left from a timeline a resume abandoned).

Note [checkpoint choice]: a resume takes the newest checkpoint whose index is valid and whose every file has
the recorded size and sha256 (tfrun.cli.setup runs `choose` before any rank starts, so every rank loads the same
step). Each one skipped, and a latest.json that is missing or names another step, is a warning. Data position
and freeze selection are functions of (step, seed), so the step restores them exactly.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tfplan.fileio import plain_mode
from tfrun.errors import TfrunError
from tfrun.records.checkpoint_choice import (  # (the layout and the choice, re-exported: checkpoint.choose, ...)
    INDEX_VERSION,
    _step_folders,
    choose,
    folder,
    index_from_dict,
    newest_complete,
    read_index,
    read_latest,
    verify,
)

__all__ = ["choose", "folder", "index_from_dict", "load", "load_weights", "newest_complete", "prune", "read_index",
           "read_latest", "save", "verify"]



def _rank_file(out: Path, step: int, rank: int) -> Path:
    return folder(out, step) / f"rank{rank}.pt"


class _HashingWriter(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `file`."""

    def __init__(self, file) -> None:
        self.file, self.sha, self.size = file, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.file.write(data)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a folder
    finally:
        os.close(fd)


def _write_durable(path: Path, write) -> tuple[int, str]:
    """Call write(stream) on a temp file beside `path`, fsync, rename; returns (bytes, sha256 hex).

    Raises:
        TfrunError: the disk is full, read-only or the folder is gone (one line, naming the file).
    """
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        plain_mode(fd)  # (exported weights were owner-only: mkstemp's 0600)
        with os.fdopen(fd, "wb") as f:
            stream = _HashingWriter(f)
            write(stream)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
        return stream.size, stream.sha.hexdigest()
    except OSError as exc:
        raise TfrunError(f"cannot write checkpoint file {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def save(out: Path, rank: int, step: int, modules: dict, optimizer, batches, freezer, metrics: list[dict],
         online=None, *, noise=None, run: dict[str, Any] | None = None, keep: int = 0, dp: int = 1,
         loop: dict | None = None, tie=None) -> None:
    """Save this pipeline rank's state for resuming at `step` (steps completed); every process calls it (Note
    [checkpoint commit]), replica 0 of each pipeline rank writes. `run` is the run's identity for the index;
    `keep` the complete checkpoints to keep (0: all); `dp` the replicas; `loop` the training loop's own state;
    `tie` a tied model's tie (tfrun.distributed.tied): its head's copy is left out (stored once, on the first
    stage's rank).

    Raises:
        TfrunError: a weight or optimizer state that is not finite (tfrun.train Note [non-finite steps]:
            the loop never lets one through; this is the last line of defence), before anything is written.
    """
    bad = _nonfinite_tensor({"model": {s: m.state_dict() for s, m in modules.items()},
                             "optimizer": optimizer.state_dict()["state"]})
    if bad is not None:
        raise TfrunError(f"checkpoint at step {step}: {bad} is not finite; not written (the last good checkpoint "
                         "stays)")
    pipeline_ranks = dist.get_world_size() // dp
    if dist.get_rank() >= pipeline_ranks:  # another replica: replica 0 writes this pipeline rank's file
        dist.gather_object(None, None, dst=0)
        return
    path = _rank_file(out, step, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TfrunError(f"cannot create checkpoint folder {path.parent}: {exc.strerror or exc}") from None
    state = {
        "step": step,
        "models": _models_state(modules, tie),
        "optimizer": _optimizer_state(optimizer, tie),
        "data": batches.state_dict(),
        "freezer": freezer.state_dict(),
        "metrics": metrics if rank == 0 else None,
        "online": online.state_dict() if online is not None else None,
        "noise": noise.state_dict() if noise is not None else None,
        "loop": loop,
    }
    size, sha = _write_durable(path, lambda stream: torch.save(state, stream))
    parts = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object((path.name, size, sha), parts, dst=0)
    if rank != 0:
        return
    from tfplan.fileio import json_text, write_json_atomic

    written = [p for p in parts if p is not None]
    index = {"schema_version": INDEX_VERSION, "step": step, "world_size": pipeline_ranks,
             "time": time.time(), "files": {name: {"bytes": n, "sha256": h} for name, n, h in written},
             "run": run or {}}
    _write_durable(folder(out, step) / "index.json", lambda f: f.write((json_text(index) + "\n").encode()))
    write_json_atomic(Path(out) / "checkpoints" / "latest.json", {"step": step, "world_size": pipeline_ranks})
    prune(out, step, keep)


def _models_state(modules: dict, tie) -> dict:
    """Every stage's state dict, a tied head's copy left out (tfrun.distributed.tied)."""
    states = {s: m.state_dict() for s, m in modules.items()}
    return tie.without_copy(states) if tie is not None else states


def _optimizer_state(optimizer, tie) -> dict:
    """The optimizer's state dict, without the state of a tied head's copy."""
    state = optimizer.state_dict()
    return tie.without_copy_state(optimizer, state) if tie is not None else state


def _load_models(modules: dict, saved: dict, tie, where: str) -> None:
    """Load every stage's state; a tied head's copy, which the checkpoint leaves out, is filled by `tie.restore`
    afterwards (tfrun.distributed.tied)."""
    for s, module in modules.items():
        state = tie.with_placeholder(s, module, saved[s], where) if tie is not None else saved[s]
        missing, unexpected = module.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise TfrunError(f"{where}: stage {s} does not match (missing {missing[:2]}, unexpected "
                             f"{unexpected[:2]}): another model or split")


def prune(out: Path, step: int, keep: int) -> list[int]:
    """Rank 0, after checkpoint `step` is complete: delete every newer checkpoint and, when keep > 0, the
    complete ones beyond the newest `keep` and the incomplete older ones; returns the steps deleted."""
    folders = _step_folders(out)
    complete = [s for s, path in folders if s <= step and (path / "index.json").exists()]
    kept = set(complete[:keep] if keep else complete)
    gone = []
    for s, path in folders:
        if s > step or (keep and s not in kept):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(s)
    return gone


def load(out: Path, rank: int, modules: dict, optimizer, batches, freezer, online=None, *, noise=None,
         step: int | None = None, loop: dict | None = None, tie=None) -> tuple[int, list[dict]]:
    """Restore this rank's state from checkpoint `step` (chosen by tfrun.cli.setup; None: latest.json's), the
    training loop's own state into `loop`, a tied head's copy from the first stage's rank (`tie`; collective);
    returns (next step, metrics so far)."""
    if step is None:
        latest = read_latest(Path(out))
        if latest is None:
            raise TfrunError(f"--resume: no checkpoint in {out} (checkpoints/latest.json missing or unreadable)")
        step = latest["step"]
    try:
        state = torch.load(_rank_file(out, step, rank), weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise TfrunError(f"--resume: cannot read {_rank_file(out, step, rank)}: {exc}") from None
    _load_models(modules, state["models"], tie, f"--resume {out}")
    optimizer.load_state_dict(state["optimizer"])
    if tie is not None:
        tie.restore(optimizer)
    batches.load_state_dict(state["data"])
    freezer.load_state_dict(state["freezer"])
    if online is not None and state.get("online") is not None:
        online.load_state_dict(state["online"])
    if noise is not None and state.get("noise") is not None:
        noise.load_state_dict(state["noise"])
    if loop is not None and state.get("loop"):
        loop.update(state["loop"])
    metrics = state["metrics"] or []
    return int(state["step"]), metrics


def _nonfinite_tensor(tree: dict, path: str = "") -> str | None:
    """The first tensor of a nested dict of state dicts that holds a NaN or an infinity, by its path."""
    for key, value in tree.items():
        where = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict):
            found = _nonfinite_tensor(value, where)
            if found is not None:
                return found
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return where
    return None


def load_weights(src: Path, rank: int, modules: dict, pipeline_ranks: int, tie=None) -> int:
    """--init-from: this pipeline rank's stage weights from run `src`'s newest complete checkpoint (nothing
    else: the optimizer, data position and freezer start fresh; a tied head's copy from the first stage's rank,
    `tie`, collective); returns the step they were saved at.

    Raises:
        TfrunError: no checkpoint there, or one of another pipeline split (ranks, stages, model).
    """
    latest = read_latest(Path(src))
    if latest is None:
        raise TfrunError(f"--init-from {src}: no checkpoint there (checkpoints/latest.json missing or unreadable)")
    if latest["world_size"] != pipeline_ranks:
        raise TfrunError(f"--init-from {src}: its checkpoint has {latest['world_size']} pipeline ranks, this job "
                         f"{pipeline_ranks}")
    try:
        state = torch.load(_rank_file(src, latest["step"], rank), weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise TfrunError(f"--init-from: cannot read {_rank_file(src, latest['step'], rank)}: {exc}") from None
    for s in modules:
        if s not in state["models"]:
            raise TfrunError(f"--init-from {src}: rank {rank} holds stages {sorted(state['models'])} there, "
                             f"stage {s} here: another pipeline split")
    _load_models(modules, state["models"], tie, f"--init-from {src}")
    if tie is not None:
        tie.restore(None)
    return int(latest["step"])

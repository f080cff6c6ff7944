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
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tfrun.errors import TfrunError

INDEX_VERSION = 1
_STEP_DIR = re.compile(r"step(\d{7})")


def folder(out: Path, step: int) -> Path:
    return Path(out) / "checkpoints" / f"step{step:07d}"


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
    """Every stage's state dict, a tied head's copy left out (Note [tied embeddings across stages])."""
    states = {s: m.state_dict() for s, m in modules.items()}
    for s, name in (tie.head_copy.items() if tie is not None else ()):
        del states[s][name]
    return states


def _optimizer_state(optimizer, tie) -> dict:
    """The optimizer's state dict, without the state of a tied head's copy."""
    state = optimizer.state_dict()
    if tie is not None and tie.head is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        state["state"].pop(next(i for i, p in enumerate(params) if p is tie.head), None)
    return state


def _load_models(modules: dict, saved: dict, tie, where: str) -> None:
    """Load every stage's state; a tied head's copy, which the checkpoint leaves out, is filled by `tie.restore`
    afterwards. A checkpoint that holds the copy was trained with the two apart (before tfrun kept ties across
    stages): refused, since going on would change the model."""
    copies = tie.head_copy if tie is not None else {}
    for s, module in modules.items():
        state = dict(saved[s])
        if s in copies:
            if copies[s] in state:
                raise TfrunError(f"{where}: this checkpoint trained the tied embedding and LM head as two matrices "
                                 f"(written before tfrun kept ties across stages); export it (`tfrun export`, it "
                                 f"comes out untied) and start from the export with tie_word_embeddings false")
            state[copies[s]] = module.state_dict()[copies[s]]  # (placeholder: restore() fills it)
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


def _step_folders(out: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every stepNNNNNNN folder, newest first."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


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


# ---------------------------------------------------------------------------------------------------------
# Reading indexes and choosing a checkpoint (no process group needed)


def index_from_dict(obj: Any) -> dict[str, Any]:
    """Validate a parsed index.json; returns it.

    Raises:
        TfrunError: naming the field.
    """
    if not isinstance(obj, dict):
        raise TfrunError("index: must be a JSON object")
    if obj.get("schema_version") != INDEX_VERSION or isinstance(obj.get("schema_version"), bool):
        raise TfrunError(f"index.schema_version: must be {INDEX_VERSION}")
    for key in ("step", "world_size"):
        value = obj.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "step" else 1):
            raise TfrunError(f"index.{key}: must be an integer >= {0 if key == 'step' else 1}")
    files = obj.get("files")
    # the length first: a damaged world_size of 10**12 must not build a set of that many names
    if not isinstance(files, dict) or len(files) != obj["world_size"] or set(files) != {
            f"rank{r}.pt" for r in range(obj["world_size"])}:
        raise TfrunError(f"index.files: must name rank0.pt .. rank{obj['world_size'] - 1}.pt")
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or isinstance(
                entry.get("bytes"), bool) or entry["bytes"] < 0:
            raise TfrunError(f"index.files.{name}.bytes: must be an integer >= 0")
        if not isinstance(entry.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):
            raise TfrunError(f"index.files.{name}.sha256: must be 64 hex digits")
    if not isinstance(obj.get("run", {}), dict):
        raise TfrunError("index.run: must be an object")
    return obj


def read_latest(out: Path) -> dict[str, int] | None:
    """latest.json as {"step", "world_size"}, or None when missing or malformed."""
    from tfplan.errors import TfplanError
    from tfplan.fileio import read_json

    path = Path(out) / "checkpoints" / "latest.json"
    try:
        obj = read_json(path, "checkpoint pointer")
    except TfplanError:
        return None
    ok = isinstance(obj, dict) and all(isinstance(obj.get(k), int) and not isinstance(obj.get(k), bool)
                                       for k in ("step", "world_size"))
    return {"step": obj["step"], "world_size": obj["world_size"]} if ok else None


def read_index(out: Path, step: int) -> dict[str, Any]:
    """The validated index of checkpoint `step`.

    Raises:
        TfrunError: missing, unreadable or invalid.
    """
    from tfplan.errors import TfplanError
    from tfplan.fileio import read_json

    path = folder(out, step) / "index.json"
    try:
        obj = read_json(path, "checkpoint index")
    except TfplanError as exc:
        raise TfrunError(str(exc)) from None
    index = index_from_dict(obj)
    if index["step"] != step:
        raise TfrunError(f"{path}: says step {index['step']}")
    return index


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


def verify(out: Path, step: int, *, hashes: bool = True) -> str | None:
    """What is wrong with checkpoint `step` (None: nothing): its index, and each file's size and sha256."""
    try:
        index = read_index(out, step)
    except TfrunError as exc:
        return str(exc).replace(str(folder(out, step)) + "/", "")
    for name, entry in sorted(index["files"].items()):
        path = folder(out, step) / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size} bytes, the index says {entry['bytes']} (truncated or rewritten)"
        if hashes and _sha256(path) != entry["sha256"]:
            return f"{name} does not match its sha256 (corrupted)"
    return None


def newest_complete(out: Path) -> int | None:
    """The newest checkpoint whose files all have their recorded sizes (no hashing: for error messages)."""
    return next((s for s, _ in _step_folders(out) if verify(out, s, hashes=False) is None), None)


def choose(out: Path, world_size: int) -> tuple[int, dict[str, Any], list[str]]:
    """The checkpoint a resume starts from (Note [checkpoint choice]): (step, the run identity its index
    records, warnings).

    Raises:
        TfrunError: no usable checkpoint, or one written by a job with another number of ranks.
    """
    latest = read_latest(out)
    problems: list[str] = []
    for step, path in _step_folders(out):
        if not (path / "index.json").exists():
            if latest is not None and latest["step"] == step and any(path.glob("rank*.pt")):
                return _legacy(out, step, latest, world_size)
            problems.append(f"checkpoint step {step} is incomplete (its save did not finish)")
            continue
        problem = verify(out, step)
        if problem is not None:
            problems.append(f"checkpoint step {step} is unusable: {problem}")
            continue
        index = read_index(out, step)
        if index["world_size"] != world_size:
            raise TfrunError(f"--resume {out}: checkpoint step {step} was written by {index['world_size']} ranks, "
                             f"this job has {world_size}")
        warnings = list(problems)
        if latest is None:
            warnings.append(f"{Path(out) / 'checkpoints' / 'latest.json'} is missing or unreadable; using the "
                            f"newest complete checkpoint")
        elif latest["step"] != step and not problems:
            warnings.append(f"checkpoints/latest.json names step {latest['step']}, which is not a complete "
                            f"checkpoint")
        if warnings:
            warnings[-1] += f"; resuming from step {step}"
        return step, index.get("run", {}), warnings
    detail = f" ({'; '.join(problems)})" if problems else ""
    raise TfrunError(f"--resume {out}: no usable checkpoint{detail}")


def _legacy(out: Path, step: int, latest: dict[str, int], world_size: int) -> tuple[int, dict, list[str]]:
    """A checkpoint from before indexes (latest.json only): used unverified, with a warning."""
    if latest["world_size"] != world_size:
        raise TfrunError(f"--resume {out}: checkpoint step {step} was written by {latest['world_size']} ranks, "
                         f"this job has {world_size}")
    return step, {}, [f"checkpoint step {step} has no index (written by an older tfrun): its files and settings "
                      f"are not verified"]


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

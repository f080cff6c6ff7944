"""Reading checkpoint indexes and choosing the checkpoint a resume starts from (no process group needed): Note
[checkpoint choice] in tfrun.records.checkpoint."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from tfrun.errors import TfrunError

INDEX_VERSION = 1
_STEP_DIR = re.compile(r"step(\d{7})")


def folder(out: Path, step: int) -> Path:
    return Path(out) / "checkpoints" / f"step{step:07d}"


def _step_folders(out: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every stepNNNNNNN folder, newest first."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)




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



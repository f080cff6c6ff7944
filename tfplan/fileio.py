"""Atomic file writes: write a temp file in the same folder, then rename over the target, so a crash
never leaves half a plan, profile, trace or CSV behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tfplan.errors import TfplanError


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically.

    Raises:
        TfplanError: the folder does not exist or is not writable.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TfplanError(f"cannot write {path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise TfplanError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented JSON (with a trailing newline) atomically."""
    write_text_atomic(path, json.dumps(obj, indent=1) + "\n")

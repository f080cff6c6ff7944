"""Atomic file writes: write a temp file in the same folder, then rename over the target, so a crash
never leaves half a plan, profile, trace or CSV behind; and `read_json`, which turns every way a JSON file
can be unreadable into one TfplanError line."""

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
        TfplanError: the folder does not exist or is not writable, or `path` is a folder.
    """
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see write_text_atomic)."""
    write_files_atomic([(path, data)])


def write_files_atomic(files: list[tuple[str | Path, bytes]]) -> None:
    """Write several files that belong together (a plan and its schedule CSV): every one to a temp file first,
    and only when all are written is each renamed over its target, so that a failure leaves every target as it
    was (a user's earlier plan included), not one new file beside an old one.

    Raises:
        TfplanError: as write_text_atomic, naming the first path that cannot be written.
    """
    temps: list[tuple[str, Path]] = []
    try:
        for path, data in files:
            temps.append((_temp_with(Path(path), data), Path(path)))
        for tmp, path in temps:
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise TfplanError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)  # (those renamed are gone already)


def check_output(path: str | Path, inputs: tuple[str | Path | None, ...] = ()) -> None:
    """Before any work: `path` can be written (a file name in a folder that exists) and is none of the command's
    `inputs` (writing a plan over the profile it was solved from would lose the profile).

    Raises:
        TfplanError: naming the option's path and why.
    """
    path = Path(path)
    _check_target(path)
    for given in inputs:
        if given is not None and Path(given).resolve() == path.resolve():
            raise TfplanError(f"cannot write {path}: it is also an input of this command; write elsewhere")


def plain_mode(fd: int) -> None:
    """Give a file from tempfile.mkstemp (created 0600) the mode a plain open() would: 0666 less the umask, so that
    what is renamed over a target is as readable by the user's group as any file they write."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def _check_target(path: Path) -> Path:
    """`path` names a file (not a folder) in a folder that exists; returns that folder."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not path.name:
        raise TfplanError(f"cannot write {path}: it is a folder; give a file name")
    if not folder.is_dir():
        raise TfplanError(f"cannot write {path}: folder {folder} does not exist")
    return folder


def _temp_with(path: Path, data: bytes) -> str:
    """A temp file beside `path` holding `data`, with the mode a plain open() would give it."""
    folder = _check_target(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise TfplanError(f"cannot write {path}: {exc.strerror}") from None
    try:
        plain_mode(fd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise TfplanError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def read_json(path: str | Path, what: str) -> Any:
    """Parse the JSON file at `path` (`what` names it in errors: "plan", "profile", ...).

    Raises:
        TfplanError: missing, unreadable, not UTF-8, invalid or too deeply nested JSON (one line each).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TfplanError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise TfplanError(f"cannot read {what} {path}: it is a folder, not a file") from None
    except OSError as exc:
        raise TfplanError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TfplanError(f"{path}: not a UTF-8 text file (byte {exc.start}); is it really a {what}?") from None
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise TfplanError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise TfplanError(f"{path}: JSON nested too deeply") from None


def _parse_int(text: str) -> int | float:
    """A JSON integer as Python reads it, except one too long for a float (or for int(), over 4,300 digits): an
    infinity of its sign, which every number check then names as not finite (instead of an OverflowError)."""
    if len(text.lstrip("-")) > 300:
        return float("-inf") if text.startswith("-") else float("inf")
    return int(text)


def json_text(obj: Any, width: int = 110, indent: str = "") -> str:
    """JSON that people can read: a record of plain values (a per-rank order, one action, one stage's
    costs) stays on one line; a container of containers goes one item per line unless it fits in `width`.

    >>> print(json_text({"a": [1, 2], "b": {"c": "d"}}, width=10))
    {
     "a": [1, 2],
     "b": {"c": "d"}
    }
    """
    return _json_text(obj, width, indent)[1]


def _json_text(obj: Any, width: int, indent: str) -> tuple[str, str]:
    """(json.dumps(obj), json_text(obj)). A container's one-line form is joined from its items' (json.dumps's
    own separators), not dumped again at every level: a million-action plan's schedule was serialised four
    times over."""
    if not isinstance(obj, (list, dict)) or not obj:
        flat = json.dumps(obj)
        return flat, flat
    values = obj.values() if isinstance(obj, dict) else obj
    if not any(isinstance(x, (list, dict)) for x in values):
        flat = json.dumps(obj)
        return flat, flat
    inner = indent + " "
    keys = [json.dumps(k) for k in obj] if isinstance(obj, dict) else []
    items = [_json_text(x, width, inner) for x in values]
    if isinstance(obj, list):
        flat = "[" + ", ".join(f for f, _ in items) + "]"
    elif all(isinstance(k, str) for k in obj):
        flat = "{" + ", ".join(f"{k}: {f}" for k, (f, _) in zip(keys, items)) + "}"
    else:  # json.dumps writes a key that is not a str (an int, say) as a string: its own one-line form
        flat = json.dumps(obj)
    if len(flat) + len(indent) <= width:
        return flat, flat
    if isinstance(obj, list):
        return flat, "[\n" + ",\n".join(inner + r for _, r in items) + "\n" + indent + "]"
    return flat, "{\n" + ",\n".join(f"{inner}{k}: {r}" for k, (_, r) in zip(keys, items)) + "\n" + indent + "}"


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write `obj` as readable JSON (with a trailing newline) atomically."""
    write_text_atomic(path, json_text(obj) + "\n")


def field_name(key: object) -> str:
    """A JSON key as an error message shows it: itself when printable and short, else JSON-quoted and cut, so
    that a key holding a newline never splits the one-line error.

    >>> field_name("speed"), field_name("a\\nb")
    ('speed', '"a\\\\nb"')
    """
    text = str(key)
    if text.isprintable() and 0 < len(text) <= 40:
        return text
    return json.dumps(text)[:40]

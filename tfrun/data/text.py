"""Offline byte-level text: the built-in corpora, one text file read as bytes, and the byte tokenizer.

Nothing is downloaded. The default corpus is the text of CPython's own `pydoc_data.topics` (about 466 KB,
shipped with every CPython); `--data stdlib` is a second domain for fine-tuning: the source of the Python
standard library's top-level modules (`STDLIB_MAX_BYTES` of it); `--data FILE` trains on any file instead.
Without `--tokenizer`, tokens are bytes (vocabulary 256), so any text works and decoding is exact.

Try it:
    python -m tfrun.data            # corpus size, split sizes and the first batch, decoded
"""

from __future__ import annotations

from pathlib import Path

import torch

from tfrun.data.batches import DataError

VOCAB_SIZE = 256
"""Byte vocabulary: token id = byte value."""

MIN_CORPUS_BYTES = 4096
"""Smallest corpus accepted, in bytes: enough for a validation tail and a few sequences."""


BINARY_PROBE_BYTES = 8192
"""A --data file with a NUL byte in its first this many bytes is refused as binary."""


def encode(text: str | bytes) -> torch.Tensor:
    """Text (UTF-8) or raw bytes -> token ids, (N,) int64.

    >>> encode("hi").tolist()
    [104, 105]
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if not data:
        return torch.empty(0, dtype=torch.long)  # frombuffer rejects an empty buffer
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def decode(ids: torch.Tensor | list[int]) -> str:
    """Token ids -> text; byte sequences that are not valid UTF-8 become U+FFFD.

    >>> decode([104, 105])
    'hi'
    """
    values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    return bytes(values).decode("utf-8", errors="replace")


def default_corpus() -> bytes:
    """The pydoc topics text, entries joined in sorted-key order so it is the same on every rank and run."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # some distributions strip pydoc_data
        raise DataError("default corpus: this Python lacks pydoc_data.topics; pass --data FILE") from exc
    return "\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


STDLIB = "stdlib"
STDLIB_MAX_BYTES = 2_000_000
"""How much of the standard library's source `--data stdlib` takes (its first modules by name)."""


def stdlib_corpus(max_bytes: int = STDLIB_MAX_BYTES) -> bytes:
    """Python source: the standard library's top-level modules (`*.py` in its folder, sorted by name, no
    site-packages), concatenated up to `max_bytes`. Ships with every CPython; fixed for a Python version."""
    import sysconfig

    folder = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for file in sorted(folder.glob("*.py")):
        text = file.read_bytes()
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return b"\n".join(parts)[:max_bytes]


def load_corpus(path: str | None, *, min_bytes: int = MIN_CORPUS_BYTES) -> bytes:
    """Bytes of the file at `path`, of the default corpus when `path` is None, or of the standard library's
    source for `path` == "stdlib" (a file of that name in the current folder wins).

    Raises:
        DataError: the file is missing, unreadable, binary (a NUL byte in its first BINARY_PROBE_BYTES) or
            shorter than `min_bytes`.
    """
    if path is None:
        data = default_corpus()
    elif path == STDLIB and not Path(path).exists():
        data = stdlib_corpus()
    else:
        file = Path(path)
        if not file.is_file():
            raise DataError(f"--data {path}: {'a folder, not a file' if file.is_dir() else 'no such file'}")
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise DataError(f"--data {path}: cannot read ({exc.strerror})") from exc
        nul = data.find(b"\0", 0, BINARY_PROBE_BYTES)  # git's test for binary files: text has no NUL bytes
        if nul >= 0:
            raise DataError(f"--data {path}: looks binary (a NUL byte at offset {nul}); tfrun trains a byte-level "
                            f"language model on text")
    if len(data) < min_bytes:
        where = "default corpus" if path is None else f"--data {path}"
        raise DataError(f"{where}: {len(data)} bytes, need at least {min_bytes}")
    return data

"""Pre-tokenized data: a flat file of raw little-endian token ids (`--data FILE.bin`), nanoGPT's layout.

A `.bin` file is every document's token ids back to back, uint16 (nanoGPT's `prepare.py`, vocabularies up to
65,536) or uint32 (`--token-dtype uint32`, larger vocabularies such as LLaMA 3's 128,256), with no header.
It is memory-mapped: a rank reads only the windows it trains on. `check` reads it once, in chunks, to refuse
a size that is not a whole number of ids and any id beyond the vocabulary (naming the first bad offset).
tfrun.data.tokenized writes its cache in the same layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tfrun.data.batches import DataError

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
"""--token-dtype -> numpy dtype (little-endian, whatever the host)."""
SUFFIX = ".bin"
CHUNK_TOKENS = 1 << 24
"""Ids checked per read (16 Mi tokens: 32-64 MiB at a time)."""


def is_token_file(path: str | None) -> bool:
    """Whether --data names a pre-tokenized file (by its `.bin` suffix)."""
    return path is not None and Path(path).suffix == SUFFIX


def dtype_of(name: str) -> np.dtype:
    """The numpy dtype of --token-dtype NAME. Raises DataError for another name."""
    if name not in DTYPES:
        raise DataError(f"--token-dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def smallest_dtype(vocab_size: int) -> str:
    """uint16 when every id of a vocabulary fits, else uint32.

    >>> smallest_dtype(50257), smallest_dtype(128256)
    ('uint16', 'uint32')
    """
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def open_tokens(path: str | Path, token_dtype: str) -> np.ndarray:
    """The ids of a token file, memory-mapped read-only, (N,) of `token_dtype`.

    Raises:
        DataError: missing, a folder, empty, or a size that is not a multiple of the dtype's.
    """
    file, dtype = Path(path), dtype_of(token_dtype)
    if not file.is_file():
        raise DataError(f"--data {path}: {'a folder, not a file' if file.is_dir() else 'no such file'}")
    size = file.stat().st_size
    if size % dtype.itemsize:
        raise DataError(f"--data {path}: {size} bytes is not a multiple of {dtype.itemsize} (--token-dtype "
                        f"{token_dtype}: {dtype.itemsize}-byte ids)")
    if size == 0:
        raise DataError(f"--data {path}: empty")
    return np.memmap(file, dtype=dtype, mode="r")


def check(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    """Every id < vocab_size, read in chunks.

    Raises:
        DataError: naming the first id beyond the vocabulary, its token index and byte offset.
    """
    for start in range(0, len(tokens), CHUNK_TOKENS):
        chunk = np.asarray(tokens[start: start + CHUNK_TOKENS])
        bad = np.flatnonzero(chunk >= vocab_size)
        if len(bad):
            i = start + int(bad[0])
            raise DataError(f"{where}: token {i} (byte offset {i * tokens.itemsize}) is {int(tokens[i])}, beyond "
                            f"the vocabulary of {vocab_size}")


def write(path: Path, ids: np.ndarray) -> None:
    """Write ids as a token file, atomically (tfplan.fileio)."""
    from tfplan.fileio import write_bytes_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, np.ascontiguousarray(ids).tobytes())

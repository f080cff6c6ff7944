"""Offline byte-level data: a corpus, a byte tokenizer, a train/validation split and resumable batches.

Nothing is downloaded. The default corpus is the text of CPython's own `pydoc_data.topics` (about 466 KB,
shipped with every CPython); `--data stdlib` is a second domain for fine-tuning: the source of the Python
standard library's top-level modules (`STDLIB_MAX_BYTES` of it); `--data FILE` trains on any file instead.
Tokens are bytes (vocabulary 256), so any file works and decoding is exact.

Every rank builds the same `Batches` from the same seed and draws the same global batch; the trainer splits
it into micro-batches with `split_microbatches`. A batch depends only on (seed, step), so resuming from
`state_dict()` replays exactly the batches an uninterrupted run would have seen.

Try it:
    python -m tfrun.data            # corpus size, split sizes and the first batch, decoded
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import torch

from tfrun.errors import TfrunError

VOCAB_SIZE = 256
"""Byte vocabulary: token id = byte value."""

MIN_CORPUS_BYTES = 4096
"""Smallest corpus accepted, in bytes: enough for a validation tail and a few sequences."""


BINARY_PROBE_BYTES = 8192
"""A --data file with a NUL byte in its first this many bytes is refused as binary."""


class DataError(TfrunError):
    """A data problem the user can fix (missing or too-short file, batch not divisible, bad resume state)."""


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


def split_tokens(tokens: torch.Tensor, val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a token stream (N,) into (train, validation); validation is the last val_fraction of it.

    The tail is held out (not a random subset) so no validation byte ever sits inside a training window.

    >>> [len(t) for t in split_tokens(torch.arange(100), 0.05)]
    [95, 5]
    """
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction: must be in (0, 1), got {val_fraction}")
    num_val = max(1, round(len(tokens) * val_fraction))
    return tokens[:-num_val], tokens[-num_val:]


def _seed_for(seed: int, step: int) -> int:
    """A 63-bit generator seed for one batch, independent of every other step's."""
    digest = hashlib.blake2b(f"batches/{seed}/{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of seq_len + 1 tokens at `starts` -> (inputs, targets), each (len(starts), seq_len) int64."""
    window = tokens[starts[:, None] + torch.arange(seq_len + 1)].long()  # (B, seq_len + 1)
    return window[:, :-1], window[:, 1:]  # targets are the inputs shifted left by one token


def _check_length(tokens: torch.Tensor, seq_len: int, what: str) -> None:
    if seq_len < 1:
        raise DataError(f"seq_len: must be >= 1, got {seq_len}")
    if len(tokens) < seq_len + 1:
        raise DataError(f"{what}: {len(tokens)} tokens, too short for one sequence of seq_len={seq_len} (+1)")


class Batches(Iterator[tuple[torch.Tensor, torch.Tensor]]):
    """Endless random training batches: next() -> (inputs, targets), each (global_batch, seq_len) int64.

    Batch `step` takes its window starts from a torch.Generator seeded by (seed, step), so it is identical
    on every rank with the same seed, and the whole position of the stream is the step counter.

    Args:
        tokens: training stream (N,), any integer dtype (uint8 saves memory; batches are int64).
        global_batch: sequences per optimizer step, over all micro-batches.
        seq_len: tokens per sequence.
        seed: batch-order seed.
    Raises:
        DataError: global_batch < 1, seq_len < 1, or a stream shorter than seq_len + 1 tokens.
    """

    def __init__(self, tokens: torch.Tensor, *, global_batch: int, seq_len: int, seed: int) -> None:
        if global_batch < 1:
            raise DataError(f"global_batch: must be >= 1, got {global_batch}")
        _check_length(tokens, seq_len, "training data")
        self.tokens, self.global_batch, self.seq_len, self.seed = tokens, global_batch, seq_len, seed
        self.step = 0  # index of the next batch to return = batches taken so far

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch for `step`, without moving the stream."""
        gen = torch.Generator().manual_seed(_seed_for(self.seed, step))
        # Any start whose seq_len + 1 window fits: [0, N - seq_len - 1].
        starts = torch.randint(0, len(self.tokens) - self.seq_len, (self.global_batch,), generator=gen)
        return _windows(self.tokens, starts, self.seq_len)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def __iter__(self) -> Batches:
        return self

    def state_dict(self) -> dict[str, int]:
        """JSON-able position; the shape fields let `load_state_dict` refuse a mismatched resume."""
        return {
            "step": self.step,
            "seed": self.seed,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "num_tokens": len(self.tokens),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a `state_dict()`; the seed, shapes and data size must match this instance's.

        Raises:
            DataError: a key is missing or a field differs (a resume with other data or batch settings).
        """
        mine = self.state_dict()
        for key in ("seed", "global_batch", "seq_len", "num_tokens", "step"):
            if key not in state:
                raise DataError(f"data state.{key}: missing")
            if key != "step" and state[key] != mine[key]:
                raise DataError(f"data state.{key}: checkpoint has {state[key]}, this run has {mine[key]}")
        if state["step"] < 0:
            raise DataError(f"data state.step: must be >= 0, got {state['step']}")
        self.step = int(state["step"])


def eval_batches(
    tokens: torch.Tensor, *, batch_size: int, seq_len: int, num_batches: int = 4
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of validation batches, each (inputs, targets) of shape (batch_size, seq_len) int64.

    Windows start at evenly spaced positions across the validation stream (no randomness), overlapping only
    when the stream is too short for batch_size * num_batches disjoint windows.
    """
    if batch_size < 1 or num_batches < 1:
        raise DataError(f"batch_size and num_batches: must be >= 1, got {batch_size}, {num_batches}")
    _check_length(tokens, seq_len, "validation data")
    last_start = len(tokens) - seq_len - 1
    starts = torch.linspace(0, last_start, batch_size * num_batches, dtype=torch.float64).round().long()
    return [_windows(tokens, chunk, seq_len) for chunk in starts.split(batch_size)]


def split_microbatches(tensor: torch.Tensor, num_microbatches: int) -> list[torch.Tensor]:
    """Split a global batch (B, ...) along dim 0 into num_microbatches equal micro-batches (B / M, ...).

    Raises:
        DataError: B is not a multiple of num_microbatches.

    >>> [m.shape[0] for m in split_microbatches(torch.zeros(8, 3), 4)]
    [2, 2, 2, 2]
    """
    if num_microbatches < 1:
        raise DataError(f"num_microbatches: must be >= 1, got {num_microbatches}")
    size = tensor.shape[0]
    if size % num_microbatches:
        raise DataError(
            f"global batch of {size} sequences cannot be split into {num_microbatches} equal micro-batches "
            f"({size} % {num_microbatches} = {size % num_microbatches}); use a multiple of {num_microbatches}"
        )
    return list(tensor.split(size // num_microbatches))


if __name__ == "__main__":
    stream = encode(load_corpus(None))
    train, val = split_tokens(stream)
    print(f"default corpus: {len(stream):,} tokens; train {len(train):,}, validation {len(val):,}")
    inputs, _ = next(Batches(train, global_batch=2, seq_len=64, seed=0))
    print(repr(decode(inputs[0])))

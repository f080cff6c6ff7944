"""Token streams into batches: a train/validation split, resumable random training batches, fixed validation
batches and micro-batches. Works on any token stream: a torch tensor (byte-level text) or a numpy array (a
memory-mapped token file, tfrun.data.tokenfile and tfrun.data.tokenized), indexed window by window.

Every rank builds the same `Batches` from the same seed and draws the same global batch; the trainer splits
it into micro-batches with `split_microbatches`. A batch depends only on (seed, step), so resuming from
`state_dict()` replays exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import torch

from tfrun.errors import TfrunError


class DataError(TfrunError):
    """A data problem the user can fix (missing or too-short file, batch not divisible, bad resume state)."""


IGNORE = -100
"""The target of a position the loss does not count (PyTorch's and Hugging Face's ignore_index)."""


class MaskedTokens:
    """A token stream whose tokens carry whether the loss counts them (chat data's answers: tfrun.data.chat): `ids`
    and `mask` (1: counts), each (N,), sliced together. A window's target is IGNORE where its token does not
    count."""

    __slots__ = ("ids", "mask")

    def __init__(self, ids, mask) -> None:
        assert len(ids) == len(mask), (len(ids), len(mask))
        self.ids, self.mask = ids, mask

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, part: slice) -> MaskedTokens:
        assert isinstance(part, slice)
        return MaskedTokens(self.ids[part], self.mask[part])


def split_tokens(tokens, val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a token stream (N,) (a tensor or numpy array) into (train, validation) views; validation is the
    last val_fraction of it.

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


def _windows(tokens, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of seq_len + 1 tokens at `starts` -> (inputs, targets), each (len(starts), seq_len) int64.
    `tokens` is a torch tensor, a numpy array (a memory-mapped file: only the windows are read) or MaskedTokens
    (targets IGNORE where the loss does not count them)."""
    index = starts[:, None] + torch.arange(seq_len + 1)  # (B, seq_len + 1)
    if isinstance(tokens, MaskedTokens):
        x, y = _windows(tokens.ids, starts, seq_len)
        counts = torch.from_numpy(np.asarray(tokens.mask)[index[:, 1:].numpy()].astype(bool))
        return x, y.masked_fill(~counts, IGNORE)
    if isinstance(tokens, np.ndarray):
        window = torch.from_numpy(tokens[index.numpy()].astype(np.int64))
    else:
        window = tokens[index].long()
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
        tokens: training stream (N,), a tensor or numpy array of any integer dtype (batches are int64).
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

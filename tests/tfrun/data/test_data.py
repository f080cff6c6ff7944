"""tfrun.data (text, batches): byte tokenizer, default corpus, --data errors, split sizes, resumable batches."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.conftest import torch_or_skip

torch = torch_or_skip()

from tfrun.data import (  # noqa: E402  (after the torch skip)
    VOCAB_SIZE,
    Batches,
    DataError,
    decode,
    encode,
    eval_batches,
    load_corpus,
    split_microbatches,
    split_tokens,
)
from tfrun.data.text import MIN_CORPUS_BYTES, default_corpus  # noqa: E402

STREAM = torch.arange(10_000) % VOCAB_SIZE  # a synthetic token stream: cheap and easy to reason about


def test_tokenizer_round_trip() -> None:
    text = "def f(x):\n    return x  # caf\u00e9, \u03bb, \u2603\n"
    ids = encode(text)
    assert ids.dtype == torch.int64 and ids.dim() == 1
    assert len(ids) == len(text.encode("utf-8")) and int(ids.max()) < VOCAB_SIZE
    assert decode(ids) == text
    assert decode(ids.tolist()) == text
    assert encode(b"\x00\xff").tolist() == [0, 255]
    assert encode("").shape == (0,)
    assert decode([0xFF]) == "\ufffd"  # invalid UTF-8 does not raise


def test_default_corpus_is_nonempty_and_deterministic() -> None:
    a, b = default_corpus(), load_corpus(None)
    assert a == b and len(a) > 400_000
    from pydoc_data.topics import topics

    assert a.startswith(topics[min(topics)].encode("utf-8"))  # sorted-key order
    digest = hashlib.sha256(a).hexdigest()
    assert digest == hashlib.sha256(default_corpus()).hexdigest()


def test_load_corpus_from_file_and_errors(tmp_path) -> None:
    good = tmp_path / "good.txt"
    good.write_bytes(b"x" * MIN_CORPUS_BYTES)
    assert load_corpus(str(good)) == b"x" * MIN_CORPUS_BYTES
    with pytest.raises(DataError, match="no such file"):
        load_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(DataError, match="a folder, not a file"):
        load_corpus(str(tmp_path))  # a directory
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"x" * 100 + b"\0" + b"x" * MIN_CORPUS_BYTES)
    with pytest.raises(DataError, match=r"looks binary \(a NUL byte at offset 100\)"):
        load_corpus(str(binary))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="0 bytes, need at least"):
        load_corpus(str(empty))
    short = tmp_path / "short.txt"
    short.write_bytes(b"hello")
    with pytest.raises(DataError, match=r"short.txt: 5 bytes"):
        load_corpus(str(short))
    assert issubclass(DataError, ValueError)


def test_split_sizes() -> None:
    train, val = split_tokens(STREAM)
    assert (len(train), len(val)) == (9_500, 500)
    assert torch.equal(torch.cat([train, val]), STREAM)  # the tail is held out, order kept
    train, val = split_tokens(STREAM, val_fraction=0.1)
    assert (len(train), len(val)) == (9_000, 1_000)
    assert len(split_tokens(torch.arange(10), 0.01)[1]) == 1  # never an empty validation set
    with pytest.raises(DataError, match="val_fraction"):
        split_tokens(STREAM, 1.0)


def test_batches_shape_and_shift() -> None:
    inputs, targets = next(Batches(STREAM, global_batch=6, seq_len=32, seed=0))
    assert inputs.shape == targets.shape == (6, 32)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    # STREAM counts up mod 256, so each target is its input + 1 (mod 256): the windows are contiguous.
    assert torch.equal(targets, (inputs + 1) % VOCAB_SIZE)


def test_batches_deterministic_per_seed() -> None:
    # Two ranks with the same seed draw the same batches, whatever the stream's integer dtype.
    rank0 = Batches(STREAM, global_batch=4, seq_len=16, seed=3)
    rank1 = Batches(STREAM.to(torch.uint8), global_batch=4, seq_len=16, seed=3)
    for _ in range(5):
        (x0, y0), (x1, y1) = next(rank0), next(rank1)
        assert torch.equal(x0, x1) and torch.equal(y0, y1) and x1.dtype == torch.int64
    fresh = Batches(STREAM, global_batch=4, seq_len=16, seed=3)
    assert torch.equal(rank0.batch_at(2)[0], fresh.batch_at(2)[0])  # random access, stream position unused
    # Another seed, or another step, gives other windows.
    other = Batches(STREAM, global_batch=4, seq_len=16, seed=4)
    assert not torch.equal(rank0.batch_at(0)[0], other.batch_at(0)[0])
    assert not torch.equal(rank0.batch_at(0)[0], rank0.batch_at(1)[0])


def test_batches_resume_from_state() -> None:
    run = Batches(STREAM, global_batch=4, seq_len=16, seed=11)
    for _ in range(3):
        next(run)
    state = json.loads(json.dumps(run.state_dict()))  # must survive a JSON checkpoint
    assert state["step"] == 3
    expected = [next(run) for _ in range(2)]
    resumed = Batches(STREAM, global_batch=4, seq_len=16, seed=11)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, [next(resumed) for _ in range(2)], strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert resumed.state_dict()["step"] == 5


def test_batches_refuse_mismatched_state() -> None:
    state = Batches(STREAM, global_batch=4, seq_len=16, seed=11).state_dict()
    with pytest.raises(DataError, match=r"data state.seed: checkpoint has 11, this run has 12"):
        Batches(STREAM, global_batch=4, seq_len=16, seed=12).load_state_dict(state)
    with pytest.raises(DataError, match="global_batch"):
        Batches(STREAM, global_batch=8, seq_len=16, seed=11).load_state_dict(state)
    with pytest.raises(DataError, match="step: missing"):
        no_step = {k: v for k, v in state.items() if k != "step"}
        Batches(STREAM, global_batch=4, seq_len=16, seed=11).load_state_dict(no_step)


def test_batches_need_enough_tokens() -> None:
    with pytest.raises(DataError, match="too short"):
        Batches(torch.arange(16), global_batch=1, seq_len=16, seed=0)
    x, y = next(Batches(torch.arange(17), global_batch=2, seq_len=16, seed=0))  # exactly one window fits
    assert torch.equal(x[0], torch.arange(16)) and torch.equal(y[1], torch.arange(1, 17))


def test_eval_batches_fixed_and_in_range() -> None:
    val = split_tokens(STREAM)[1]
    a = eval_batches(val, batch_size=3, seq_len=20, num_batches=4)
    b = eval_batches(val, batch_size=3, seq_len=20, num_batches=4)
    assert len(a) == 4
    for (x, y), (bx, by) in zip(a, b, strict=True):
        assert x.shape == y.shape == (3, 20)
        assert torch.equal(x, bx) and torch.equal(y, by)
    assert torch.equal(a[0][0][0], val[:20])  # first window starts the stream
    assert torch.equal(a[-1][1][-1], val[-20:])  # last window ends it
    with pytest.raises(DataError, match="validation data"):
        eval_batches(val[:10], batch_size=1, seq_len=20)


def test_split_microbatches() -> None:
    x = torch.arange(24).view(12, 2)
    parts = split_microbatches(x, 4)
    assert [p.shape for p in parts] == [(3, 2)] * 4
    assert torch.equal(torch.cat(parts), x)
    with pytest.raises(DataError, match=r"global batch of 12 sequences cannot be split into 5 equal micro"):
        split_microbatches(x, 5)
    with pytest.raises(DataError, match="num_microbatches"):
        split_microbatches(x, 0)


def test_default_corpus_end_to_end() -> None:
    train, val = split_tokens(encode(load_corpus(None)))
    inputs, _ = next(Batches(train, global_batch=2, seq_len=64, seed=0))
    assert inputs.shape == (2, 64)
    assert len(eval_batches(val, batch_size=4, seq_len=128)) == 4

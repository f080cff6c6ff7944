"""tfrun.data's sources besides bytes: text, jsonl and folders through a BPE tokenizer trained here (cached once,
read back without tokenizing), `.bin` token files (uint16/uint32, every id checked), the vocabulary agreement
with the model, and batches over a memory-mapped stream resuming exactly. One process."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import torch_or_skip

torch = torch_or_skip()
pytest.importorskip("tokenizers", reason="the hf extra")

from tests.tokenizer_fixture import corpus_documents, train_tokenizer, write_jsonl  # noqa: E402
from tfrun.data import (  # noqa: E402
    Batches,
    DataError,
    open_stream,
    rank_tokens,
    split_tokens,
    tokenfile,
    tokenized,
)


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _open(data, tok=None, vocab=320, cache=None, dtype="uint16"):
    return open_stream(str(data), tokenizer_path=None if tok is None else str(tok), token_dtype=dtype,
                       model_vocab=vocab, cache_dir=cache)


def test_text_jsonl_and_folder_tokenize_to_the_documents_ids(tmp_path, tok_path):
    docs = corpus_documents()[:40]
    tok = tokenized.load_tokenizer(str(tok_path))
    expected = np.concatenate([tok.impl.encode(d).ids for d in docs])
    assert expected[0] == 1 and (expected == 1).sum() == len(docs)  # <s> starts each document
    jsonl = write_jsonl(tmp_path / "docs.jsonl", docs)
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", docs[:20])
    for i, d in enumerate(docs[20:]):
        (folder / "sub" / f"{i:03d}.txt").write_text(d)
    (folder / "skip.py").write_text("not a document")
    for data in (jsonl, folder):
        stream = _open(data, tok_path, cache=tmp_path / f"cache-{data.name}")
        assert np.array_equal(stream.tokens, expected) and stream.tokens.dtype == np.uint16
    text = tmp_path / "one.txt"
    text.write_text(docs[0])
    assert np.array_equal(_open(text, tok_path, cache=tmp_path / "c").tokens, tok.impl.encode(docs[0]).ids)


def test_tokenized_once_then_read_from_the_cache(tmp_path, tok_path, monkeypatch):
    data = write_jsonl(tmp_path / "docs.jsonl", corpus_documents()[:30])
    first = _open(data, tok_path, cache=tmp_path / "cache")
    assert first.save is not None and not (tmp_path / "cache").exists()  # nothing written before save()
    first.save()
    monkeypatch.setattr(tokenized, "encode_documents", lambda *a: pytest.fail("tokenized again"))
    second = _open(data, tok_path, cache=tmp_path / "cache")
    assert second.cache == first.cache and second.identity == first.identity
    assert np.array_equal(second.tokens, first.tokens) and isinstance(second.tokens, np.memmap)
    in_rank = rank_tokens(str(data), token_cache=second.cache, token_dtype="uint16")
    assert np.array_equal(in_rank, first.tokens)
    assert _open(second.cache).identity == first.identity  # the cache as a .bin file is the same data
    monkeypatch.undo()
    other = write_jsonl(tmp_path / "other.jsonl", corpus_documents()[30:60])
    assert _open(other, tok_path, cache=tmp_path / "cache").cache != first.cache  # the data is in the key


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_bin_files_read_little_endian_ids(tmp_path, dtype):
    ids = (np.arange(50_000) * 7919 % 300).astype(dtype)
    path = tmp_path / "data.bin"
    path.write_bytes(ids.astype(f"<{np.dtype(dtype).str[1:]}").tobytes())
    stream = _open(path, dtype=dtype)
    assert np.array_equal(stream.tokens, ids) and stream.identity.startswith("sha256:")
    assert np.array_equal(rank_tokens(str(path), token_cache=None, token_dtype=dtype), ids)


def test_bin_and_vocabulary_refusals(tmp_path, tok_path):
    path = tmp_path / "data.bin"
    ids = np.full(10_000, 5, dtype="<u2")
    ids[7_777] = 320
    path.write_bytes(ids.tobytes())
    with pytest.raises(DataError, match="token 7777 \\(byte offset 15554\\) is 320, beyond the vocabulary of 320"):
        _open(path)
    path.write_bytes(ids.tobytes() + b"\0")
    with pytest.raises(DataError, match="20001 bytes is not a multiple of 2"):
        _open(path)
    with pytest.raises(DataError, match="vocabulary of 320 tokens is larger than the model's 300"):
        _open(write_jsonl(tmp_path / "d.jsonl", ["x" * 5000]), tok_path, vocab=300, cache=tmp_path)
    with pytest.raises(DataError, match="byte-level text needs a vocabulary of 256, the model has 200"):
        _open(write_jsonl(tmp_path / "d.jsonl", ["x" * 5000]), vocab=200)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=f"{bad}: line 2 has no \"text\" field"):
        _open(bad, tok_path, cache=tmp_path)


def test_jsonl_without_a_tokenizer_is_bytes_of_its_documents(tmp_path):
    docs = ["first document " * 200, "second one " * 200]
    stream = _open(write_jsonl(tmp_path / "d.jsonl", docs), vocab=256)
    assert bytes(stream.tokens.tolist()) == "\n".join(docs).encode()


def test_batches_over_a_token_file_resume_exactly(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes((np.arange(20_000) % 300).astype("<u2").tobytes())
    train, _ = split_tokens(tokenfile.open_tokens(path, "uint16"))
    full = Batches(train, global_batch=4, seq_len=16, seed=3)
    expected = [next(full) for _ in range(6)]
    part = Batches(train, global_batch=4, seq_len=16, seed=3)
    for _ in range(3):
        next(part)
    resumed = Batches(split_tokens(tokenfile.open_tokens(path, "uint16"))[0], global_batch=4, seq_len=16, seed=3)
    resumed.load_state_dict(part.state_dict())
    for x, y in expected[3:]:
        rx, ry = next(resumed)
        assert torch.equal(rx, x) and torch.equal(ry, y) and rx.dtype == torch.int64
